"""The conversation items, one ``TypedDict`` per kind, as the server and the client both see them.

These are the canonical forms the server's core keeps after checking a client's input
(``server.core.api.requests``) or building the model's output (``server.core.runs.streaming``):
the Responses API's JSON shapes, so that transports serialize them as they are, and the client
reads them back as the same types (``codec.items``). ``type`` (and ``role``/``status``)
are ``Literal`` types, so a check of ``item["type"]`` narrows an ``Item`` to its kind.

Only genuinely free JSON (function arguments' schemas, annotations, tools an item carries
along) is typed ``JSONValue``/``JSONObject``.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypeAlias, TypedDict

from .json_types import JSONObject

Role = Literal["user", "assistant", "system", "developer"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]
ImageDetail = Literal["auto", "low", "high"]


class InputTextPart(TypedDict):
    """Text a user, system or developer message carries."""

    type: Literal["input_text"]
    text: str


class OutputTextPart(TypedDict):
    """Text the model wrote (an assistant message)."""

    type: Literal["output_text"]
    text: str
    annotations: list[JSONObject]


class RefusalPart(TypedDict):
    """The model declining to answer."""

    type: Literal["refusal"]
    refusal: str


class InputImagePart(TypedDict):
    """An image by URL (rendered as a placeholder: the engines here read text only)."""

    type: Literal["input_image"]
    image_url: str
    detail: ImageDetail


ContentPart: TypeAlias = InputTextPart | OutputTextPart | RefusalPart | InputImagePart


class SummaryTextPart(TypedDict):
    """One part of a reasoning item's summary."""

    type: Literal["summary_text"]
    text: str


class ReasoningTextPart(TypedDict):
    """One part of a reasoning item's full text (only some upstreams send it)."""

    type: Literal["reasoning_text"]
    text: str


class MessageItem(TypedDict):
    """A message of any role; the model's own are ``assistant`` messages."""

    type: Literal["message"]
    role: Role
    content: list[ContentPart]
    id: NotRequired[str]
    status: NotRequired[ItemStatus]
    # The hosted API's label of an assistant message (``commentary`` / ``final_answer``).
    phase: NotRequired[str]


class FunctionCallItem(TypedDict):
    """A call of a client-side function tool; ``arguments`` is a string of JSON."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: NotRequired[str]
    status: NotRequired[ItemStatus]


class FunctionCallOutputItem(TypedDict):
    """The client's answer to a ``function_call`` (text parts are joined into ``output``)."""

    type: Literal["function_call_output"]
    call_id: str
    output: str
    id: NotRequired[str]
    status: NotRequired[ItemStatus]


class ReasoningItem(TypedDict):
    """The model's reasoning, shown as its summary."""

    type: Literal["reasoning"]
    summary: list[SummaryTextPart]
    content: NotRequired[list[ReasoningTextPart]]
    id: NotRequired[str]
    encrypted_content: NotRequired[str]
    status: NotRequired[ItemStatus]


class CompactionItem(TypedDict):
    """A compacted stretch of conversation: a server-sealed token
    (``server.core.runs.compaction``)."""

    type: Literal["compaction"]
    encrypted_content: str
    id: NotRequired[str]
    created_by: NotRequired[str]


class CustomToolCallItem(TypedDict):
    """A call of a free-form (custom) tool; carried along as the client sent it."""

    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: NotRequired[str]
    id: NotRequired[str]
    status: NotRequired[ItemStatus]


class CustomToolCallOutputItem(TypedDict):
    """The client's answer to a ``custom_tool_call``; carried along as sent."""

    type: Literal["custom_tool_call_output"]
    call_id: str
    output: str | list[JSONObject]
    id: NotRequired[str]
    status: NotRequired[ItemStatus]


class AdditionalToolsItem(TypedDict):
    """Tools a client declares mid-conversation (Codex); carried along as sent."""

    type: Literal["additional_tools"]
    tools: NotRequired[list[JSONObject]]
    id: NotRequired[str]
    status: NotRequired[ItemStatus]


#: Items the model produces.
OutputItem: TypeAlias = MessageItem | FunctionCallItem | ReasoningItem
#: Items the core carries along without a typed case of its own (kept as the client sent them).
PassthroughItem: TypeAlias = CustomToolCallItem | CustomToolCallOutputItem | AdditionalToolsItem
#: Any conversation item, after checking; narrow it with ``item["type"]``.
Item: TypeAlias = (
    MessageItem
    | FunctionCallItem
    | FunctionCallOutputItem
    | ReasoningItem
    | CompactionItem
    | PassthroughItem
)


def part_text(part: ContentPart) -> str:
    """The text a content part contributes to its message (an image is a placeholder)."""
    if part["type"] == "refusal":
        return part["refusal"]
    if part["type"] == "input_image":
        return "[image]"
    return part["text"]
