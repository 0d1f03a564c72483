"""What a finished response leaves behind: its ledger row and, with ``store: true``, its
stored form. Pure functions of the response's record, so that a response ended by its
terminal event and one cut short by its stream's end write the same rows."""

from __future__ import annotations

from bidi_responses.schema import Item, ResponseObject

from ..conversation.state import ConversationState
from ..storage.store import LedgerRow, StoredResponse
from ..tenancy.caller import Caller
from .record import ResponseRecord, Usage


def ledger_row(record: ResponseRecord, usage: Usage, caller: Caller, transport: str) -> LedgerRow:
    """The usage ledger's row for the response."""
    request = record.request
    return LedgerRow(
        response_id=record.id,
        # The authenticated tenant; on an open server the body's user or the token's label.
        tenant=caller.account(request.user),
        model=request.model,
        status=record.status,
        input_tokens=usage.input_tokens,
        cached_tokens=usage.cached_tokens,
        output_tokens=usage.output_tokens,
        engine_ms=record.stats.engine_ms,
        api_pre_ms=record.stats.api_pre_ms,
        api_post_ms=record.stats.api_post_ms,
        transport=transport,
        created_at=record.created_at,
        completed_at=record.completed_at,
    )


def stored_response(
    record: ResponseRecord,
    snapshot: ResponseObject,
    state: ConversationState | None,
    inputs: list[Item],
    tenant: str | None,
) -> StoredResponse | None:
    """What ``store: true`` keeps: completed, incomplete and cancelled responses alike
    (a cancelled one with the output it had), as the hosted API stores them; a background
    response however it ended. ``inputs`` are the items this response's requests added."""
    request = record.request
    if not request.store or state is None:
        return None
    # A failed response is stored only in background mode: its client polls for it.
    if record.status == "failed" and not request.background:
        return None
    self_contained = request.previous_response_id is None or not state.stored_chain
    if self_contained:
        # The whole conversation but this response's output (see ``sqlite_schema``).
        output_ids = {id(item) for item in record.output}
        kept = [item for item in state.items if id(item) not in output_ids]
    else:
        kept = list(inputs)
    return StoredResponse(
        response=snapshot,
        input_items=kept,
        previous_response_id=request.previous_response_id,
        self_contained=self_contained,
        tenant=tenant,
    )
