"""The events of one response's life and output, each a ``TypedDict`` of the JSON the core
builds once (``server.core.runs.record``, ``server.core.runs.streaming``).

The lifecycle events carry the whole Response (``SnapshotEvent``; ``TerminalEvent`` ends it);
the others say what was added to its output, item by item, part by part, delta by delta.
"""

from __future__ import annotations

from typing import Literal, TypeAlias, TypedDict

from .items import FunctionCallItem, Item, OutputTextPart
from .response_object import ResponseObject

#: How a response ends, as its terminal event says it.
Outcome = Literal["completed", "incomplete", "failed"]


# -- the response's lifecycle: each carries the whole Response -------------------------------


class ResponseCreatedEvent(TypedDict):
    type: Literal["response.created"]
    response: ResponseObject
    sequence_number: int


class ResponseQueuedEvent(TypedDict):
    type: Literal["response.queued"]
    response: ResponseObject
    sequence_number: int


class ResponseInProgressEvent(TypedDict):
    type: Literal["response.in_progress"]
    response: ResponseObject
    sequence_number: int


class ResponseCompletedEvent(TypedDict):
    type: Literal["response.completed"]
    response: ResponseObject
    sequence_number: int


class ResponseFailedEvent(TypedDict):
    type: Literal["response.failed"]
    response: ResponseObject
    sequence_number: int


class ResponseIncompleteEvent(TypedDict):
    type: Literal["response.incomplete"]
    response: ResponseObject
    sequence_number: int


class ResponseDoneEvent(TypedDict):
    """Append mode: the response pauses until the client answers ``pending_calls``."""

    type: Literal["response.done"]
    response: ResponseObject
    pending_calls: list[FunctionCallItem]
    sequence_number: int


TerminalEvent: TypeAlias = ResponseCompletedEvent | ResponseFailedEvent | ResponseIncompleteEvent
SnapshotEvent: TypeAlias = (
    ResponseCreatedEvent | ResponseQueuedEvent | ResponseInProgressEvent | TerminalEvent
)

# -- output items and their content ----------------------------------------------------------


class OutputItemAddedEvent(TypedDict):
    type: Literal["response.output_item.added"]
    output_index: int
    item: Item
    sequence_number: int


class OutputItemDoneEvent(TypedDict):
    type: Literal["response.output_item.done"]
    output_index: int
    item: Item
    sequence_number: int


class ContentPartAddedEvent(TypedDict):
    type: Literal["response.content_part.added"]
    item_id: str
    output_index: int
    content_index: int
    part: OutputTextPart
    sequence_number: int


class ContentPartDoneEvent(TypedDict):
    type: Literal["response.content_part.done"]
    item_id: str
    output_index: int
    content_index: int
    part: OutputTextPart
    sequence_number: int


class OutputTextDeltaEvent(TypedDict):
    type: Literal["response.output_text.delta"]
    item_id: str
    output_index: int
    content_index: int
    delta: str
    sequence_number: int


class OutputTextDoneEvent(TypedDict):
    type: Literal["response.output_text.done"]
    item_id: str
    output_index: int
    content_index: int
    text: str
    sequence_number: int


class FunctionCallArgumentsDeltaEvent(TypedDict):
    type: Literal["response.function_call_arguments.delta"]
    item_id: str
    output_index: int
    delta: str
    sequence_number: int


class FunctionCallArgumentsDoneEvent(TypedDict):
    type: Literal["response.function_call_arguments.done"]
    item_id: str
    output_index: int
    arguments: str
    name: str
    sequence_number: int


# Reasoning is shown whole in its ``output_item.done`` (the engines stream no reasoning
# deltas), so the API's reasoning delta events are never sent.
