"""The Response object, as the server builds it and the client reads it back
(``codec.responses``).

``ResponseObject`` carries every field of the API (nullable ones as None) and the server's
extensions (``stats``, ``safety_flags``); the types of its parts are here too: the request's
settings as it echoes them, usage, stats, a stage's findings, why it failed or stopped.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypeAlias, TypedDict

from .items import Item
from .json_types import JSONObject

ResponseStatus = Literal["queued", "in_progress", "completed", "failed", "incomplete", "cancelled"]


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
