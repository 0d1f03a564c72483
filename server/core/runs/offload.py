"""Bounded work per request: how much input a create carries, its bound, and running the
pre-inference work of a large one, and the rendering of a long answer, off the event loop.

Checking, classifying and rendering cost time in proportion to the text's characters. A
small request does that work inline (a thread hop costs more than the work); one of at least
``limits.offload_chars`` characters does it in a worker thread, so other streams' events keep
flowing while it is tokenized (tiktoken releases the GIL while it encodes, and the bounded
encoder hands it short segments) and scanned (the classifiers scan a large text in windows).
An answer is rendered onto the conversation's tokens before its terminal event, by the same
rule: a long one (a model writing a document) would otherwise hold every stream for the
milliseconds its tokenizing takes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ParamSpec, TypeVar

import orjson
from bidi_responses.schema import Item

from ...config import Limits
from ..api.errors import ApiError
from ..api.requests import CreateRequest
from ..ports import iter_texts, off_loop_from

P = ParamSpec("P")
T = TypeVar("T")


def item_chars(items: Iterable[Item]) -> int:
    """The characters of text the classifiers and the renderer read in ``items``."""
    return sum(len(text) for item in items for _, text in iter_texts(item, ""))


def request_chars(request: CreateRequest, limits: Limits) -> int:
    """The characters a create asks the server to check and render (instructions, tools and
    input); ApiError 400 naming the field when they pass the configured work bound.

    Input items are bounded when they are parsed (``max_item_chars`` each,
    ``max_request_chars`` in all); the instructions and the tools (as JSON) count against the
    same bounds.
    """
    instructions = len(request.instructions or "")
    if instructions > limits.max_item_chars:
        raise ApiError(
            f"Invalid 'instructions': string too long. Expected a string with maximum length "
            f"{limits.max_item_chars}, but got a string with length {instructions} instead.",
            code="string_above_max_length",
            param="instructions",
        )
    tools = len(orjson.dumps(request.tools).decode()) if request.tools else 0
    if tools > limits.max_item_chars:
        raise ApiError(
            f"Invalid 'tools': the tool definitions are larger than {limits.max_item_chars} "
            f"characters ({tools}).",
            code="input_too_large",
            param="tools",
        )
    total = instructions + tools + item_chars(request.input)
    if total > limits.max_request_chars:
        raise ApiError(
            f"Invalid 'instructions': the instructions, tools and input together are larger than "
            f"{limits.max_request_chars} characters.",
            code="input_too_large",
            param="instructions",
        )
    return total


async def offload(
    size: int, limits: Limits, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """``work(*args, **kwargs)``: inline when ``size`` (characters) is under
    ``limits.offload_chars``, else in a worker thread (the caller waits; the loop does not;
    a cancellation waits for the thread, which writes the run's state)."""
    return await off_loop_from(size, limits.offload_chars, work, *args, **kwargs)
