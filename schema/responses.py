"""The Response object and the server events, one ``TypedDict`` per event type.

The server's core builds each event once as one of these JSON shapes
(``server.core.runs.record``, ``server.core.runs.streaming``); WebSocket and SSE write it as
JSON and gRPC maps it by field name, so nothing here knows a wire. The client reads a Response
back as the same ``ResponseObject`` (``codec.responses``). ``ServerEvent`` is every event a
stream can carry; narrow it with ``event["type"]``.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypeAlias, TypedDict

from .items import FunctionCallItem, Item, OutputTextPart
from .json_types import JSONObject, JSONValue

ResponseStatus = Literal["queued", "in_progress", "completed", "failed", "incomplete", "cancelled"]
#: How a response ends, as its terminal event says it.
Outcome = Literal["completed", "incomplete", "failed"]


# -- the request's settings, as the Response echoes them -------------------------------------

ToolChoiceMode = Literal["none", "auto", "required"]


class FunctionToolChoice(TypedDict):
    """A forced call of one function tool."""

    type: Literal["function"]
    name: str


ToolChoice: TypeAlias = ToolChoiceMode | FunctionToolChoice


class PlainTextFormat(TypedDict):
    type: Literal["text", "json_object"]


class JSONSchemaFormat(TypedDict):
    """Structured output: the answer is JSON of ``schema``."""

    type: Literal["json_schema"]
    name: str
    schema: JSONObject
    description: NotRequired[str]
    strict: bool | None


TextFormat: TypeAlias = PlainTextFormat | JSONSchemaFormat


class TextConfig(TypedDict):
    """``text``: the output format, and a verbosity when the request gave one."""

    format: TextFormat
    verbosity: NotRequired[Literal["low", "medium", "high"]]


class ReasoningConfig(TypedDict):
    """``reasoning``, echoed with both keys (None when unset)."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None
    summary: Literal["auto", "concise", "detailed"] | None


# -- usage, stats, errors --------------------------------------------------------------------


class InputTokensDetails(TypedDict):
    cached_tokens: int


class OutputTokensDetails(TypedDict):
    reasoning_tokens: int


class UsageObject(TypedDict):
    """The Responses ``usage`` object."""

    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class StatsObject(TypedDict):
    """``response.stats``: the server's own counters of one response (an extension)."""

    items_validated: int
    tokens_rendered: int
    tokens_reused: int
    prefill_tokens: int
    engine_ms: float
    api_pre_ms: float
    api_post_ms: float
    route_resolved: bool
    stage_items: dict[str, int]
    stage_ms: dict[str, float]
    pre_inference_runs: int
    engine_runs: int
    engine_prompt_tokens: int
    engine_cached_tokens: int


class SafetyFlagObject(TypedDict):
    """One finding of a pipeline stage, on ``response.safety_flags`` (an extension)."""

    classifier: str
    code: str
    param: str
    message: str


class IncompleteDetails(TypedDict):
    reason: str


class ResponseError(TypedDict):
    """Why a response failed (``response.error``)."""

    code: str
    message: str


class ErrorObject(TypedDict):
    """OpenAI's error object: the body of an HTTP error and of an ``error`` event."""

    type: str
    code: str
    message: str
    param: str | None
    # The limit that was hit (gRPC ErrorInfo metadata, ``ApiError.metadata``).
    limit: NotRequired[str]
    limit_value: NotRequired[str]
    retry_after_s: NotRequired[str]
    # Which client request the error answers (``events.answers_to``).
    request_type: NotRequired[str]
    event_id: NotRequired[str]
    response_id: NotRequired[str]


class ResponseObject(TypedDict):
    """The Response: all 31 fields of the API (nullable ones as None) plus the extensions."""

    id: str
    object: Literal["response"]
    created_at: int
    completed_at: int | None
    status: ResponseStatus
    incomplete_details: IncompleteDetails | None
    model: str
    previous_response_id: str | None
    instructions: str | None
    output: list[Item]
    error: ResponseError | None
    tools: list[JSONObject]
    tool_choice: ToolChoice
    truncation: str
    parallel_tool_calls: bool
    text: TextConfig
    top_p: float
    presence_penalty: float
    frequency_penalty: float
    temperature: float
    top_logprobs: int
    reasoning: ReasoningConfig | None
    usage: UsageObject | None
    max_output_tokens: int | None
    max_tool_calls: int | None
    store: bool
    background: bool
    service_tier: str
    safety_identifier: str | None
    prompt_cache_key: str | None
    metadata: dict[str, str]
    # The server always sets the two below; a Response read over gRPC lacks ``user`` (the
    # proto's Response has no such field), and a Response message may leave ``stats`` unset.
    user: NotRequired[str | None]
    safety_flags: list[SafetyFlagObject]
    stats: NotRequired[StatsObject]


class DeletedResponse(TypedDict):
    """The answer to deleting a stored response."""

    id: str
    object: Literal["response.deleted"]
    deleted: bool


class InputItemList(TypedDict):
    """One page of a stored response's input items (OpenAI's list shape)."""

    object: Literal["list"]
    data: list[Item]
    first_id: str | None
    last_id: str | None
    has_more: bool


class CompactionResponse(TypedDict):
    """The answer to ``POST /v1/responses/compact``."""

    id: str
    object: Literal["response.compaction"]
    created_at: int
    output: list[Item]
    usage: UsageObject
    # The request's, echoed (None when it sent none).
    safety_identifier: str | None
    # Always "default" (as a create echoes it).
    service_tier: str


class InputTokensCount(TypedDict):
    """The answer to ``POST /v1/responses/input_tokens``."""

    object: Literal["response.input_tokens"]
    input_tokens: int


class ModelObject(TypedDict):
    """One configured model alias (``GET /v1/models/{model}``)."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(TypedDict):
    object: Literal["list"]
    data: list[ModelObject]


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

# -- steering and injection (WebSocket mode as the official SDKs type it) --------------------


class SteerRef(TypedDict):
    """A steering submission the server owns (accepted, or still pending)."""

    id: str
    previous_response_id: str


class FailedSteer(TypedDict):
    """A steering submission returned uncommitted; ``id`` only once one was allocated."""

    previous_response_id: str
    input: JSONValue
    id: NotRequired[str]


class SteerError(TypedDict):
    code: str
    message: str
    type: Literal["invalid_request_error"]


class ResponseSteerAcceptedEvent(TypedDict):
    """The server owns the steering input; the successor's ``response.created`` commits it."""

    type: Literal["response.steer.accepted"]
    steer: SteerRef
    sequence_number: int


class ResponseSteerFailedEvent(TypedDict):
    """Steering input refused, or accepted but not committable (same ``steer.id``)."""

    type: Literal["response.steer.failed"]
    steer: FailedSteer
    error: SteerError
    sequence_number: int


class RequiredInputStub(TypedDict):
    """An outstanding client-owned result the explicit continuation must carry."""

    type: str
    call_id: str
    name: NotRequired[str]


class ResponseSteerPendingEvent(TypedDict):
    """After ``response.completed``: the target waits for client tool outputs; the queued
    steering input is put before them in the client's next create on that parent and lane."""

    type: Literal["response.steer.pending"]
    steer: SteerRef
    reason: str
    required_input: list[RequiredInputStub]
    sequence_number: int


class ResponseInjectCreatedEvent(TypedDict):
    """``response.inject`` (beta): every injected item was committed to the response."""

    type: Literal["response.inject.created"]
    response_id: str
    sequence_number: int


class InjectError(TypedDict):
    code: Literal["response_already_completed", "response_not_found"]
    message: str


class ResponseInjectFailedEvent(TypedDict):
    """``response.inject`` (beta): nothing committed; the raw input comes back."""

    type: Literal["response.inject.failed"]
    response_id: str
    input: list[JSONValue]
    error: InjectError
    sequence_number: int


SteerEvent: TypeAlias = (
    ResponseSteerAcceptedEvent
    | ResponseSteerFailedEvent
    | ResponseSteerPendingEvent
    | ResponseInjectCreatedEvent
    | ResponseInjectFailedEvent
)

# -- stream-level events ---------------------------------------------------------------------


class ErrorEvent(TypedDict):
    """WebSocket mode's nested error (also used on Connect); the turn ends with it."""

    type: Literal["error"]
    status: int
    error: ErrorObject


class WarningEvent(TypedDict):
    """Advance notice about the stream (its age limit, the server draining)."""

    type: Literal["warning"]
    code: str
    message: str


#: Every event of one response, as the core emits it.
ResponseEvent: TypeAlias = (
    SnapshotEvent
    | ResponseDoneEvent
    | OutputItemAddedEvent
    | OutputItemDoneEvent
    | ContentPartAddedEvent
    | ContentPartDoneEvent
    | OutputTextDeltaEvent
    | OutputTextDoneEvent
    | FunctionCallArgumentsDeltaEvent
    | FunctionCallArgumentsDoneEvent
    | ErrorEvent
)
#: Everything a stream can carry to its client.
ServerEvent: TypeAlias = ResponseEvent | SteerEvent | WarningEvent


def terminal_response(event: ServerEvent) -> ResponseObject | None:
    """The Response a terminal event carries (None for the other events)."""
    if (
        event["type"] == "response.completed"
        or event["type"] == "response.failed"
        or event["type"] == "response.incomplete"
    ):
        return event["response"]
    return None


def snapshot_of(event: ServerEvent) -> ResponseObject | None:
    """The Response a lifecycle event carries (None for the other events)."""
    if (
        event["type"] == "response.created"
        or event["type"] == "response.queued"
        or event["type"] == "response.in_progress"
        or event["type"] == "response.completed"
        or event["type"] == "response.failed"
        or event["type"] == "response.incomplete"
        or event["type"] == "response.done"
    ):
        return event["response"]
    return None
