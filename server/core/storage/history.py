"""A conversation as the durable store keeps it: the chain of a stored response."""

from __future__ import annotations

from bidi_responses.schema import Item, ResponseObject

from ...config import Limits
from ..api.errors import previous_response_not_found
from ..api.input_items import parse_input
from .backend import ResponseStore


async def stored_history(
    store: ResponseStore, limits: Limits, previous: str, tenant: str | None
) -> tuple[list[Item], ResponseObject]:
    """The conversation up to and including stored response ``previous`` of ``tenant``,
    checked again like any input (400 ``previous_response_not_found`` if it is not stored,
    or is another tenant's), and that response."""
    chain = await store.chain(previous, tenant)
    if chain is None:
        raise previous_response_not_found(previous)
    history: list[Item] = []
    for link in chain:
        history.extend(link.input_items)
        history.extend(link.response.get("output", ()))
    items, _ = parse_input(history, limits, where="history")
    return items, chain[-1].response
