"""Types at the client's boundary: plain dataclasses and the API's typed dicts, no protobuf.

A Response and its items are the server's own types (``bidi_responses.schema``): ``output`` is
a ``list[Item]``, narrowed by ``item["type"]``. Events and request parameters stay free JSON
(``JSONObject``), shaped as the Responses API documents them: the client passes them through
and reads only the fields it names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeAlias, TypeGuard

from bidi_responses.schema import (
    ContentPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    Item,
    MessageItem,
    OutputTextPart,
    RequiredInputStub,
    ResponseError,
    ResponseObject,
    ResponseStatus,
    SafetyFlagObject,
    SteerError,
    UsageObject,
)
from bidi_responses.schema import JSONMapping as JSONMapping
from bidi_responses.schema import JSONObject as JSONObject
from bidi_responses.schema import JSONValue as JSONValue

#: A create's ``input``: a user message's text, or the items to add (``Item``s, such as
#: ``Response.call_output``'s, or JSON of their shape, such as ``{"role", "content": "text"}``).
ResponseInput: TypeAlias = str | Sequence[JSONMapping]

TERMINAL_EVENTS = frozenset({"response.completed", "response.failed", "response.incomplete"})


class ResponsesError(Exception):
    """The server rejected a request (an ``error`` event or a non-OK gRPC status)."""

    def __init__(
        self, code: str | None, message: str, param: str | None = None, status: int | None = None
    ) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code
        self.message = message
        self.param = param
        self.status = status

    @classmethod
    def from_event(cls, event: JSONObject) -> ResponsesError:
        """From a JSON ``error`` event."""
        error = event.get("error") or {}
        return cls(
            error.get("code"), error.get("message", ""), error.get("param"), event.get("status")
        )


class NoSuccessor(ResponsesError):
    """No automatic successor follows a steered response: its steering input was returned
    (``response.steer.failed``) or waits for tool outputs (``response.steer.pending``: send
    them in a create on the same lane with ``previous_response_id`` = the steered response;
    the server puts the steering input first). ``event`` is that event."""

    def __init__(self, event: JSONObject) -> None:
        error = event.get("error") or {}
        code = error.get("code") or event.get("reason") or ""
        message = error.get("message") or "the response waits for client tool outputs"
        super().__init__(code, message)
        self.event = event

    @property
    def required_input(self) -> list[RequiredInputStub]:
        """The results the continuation must carry (``response.steer.pending`` only)."""
        required: list[RequiredInputStub] = self.event.get("required_input") or []
        return required


@dataclass(frozen=True, slots=True)
class SteerAck:
    """The server's answer to a steer: ``accepted`` (the server owns the input; the
    successor's ``response.created`` commits it) or refused (nothing was queued; ``input`` is
    the input returned, ``error`` says why)."""

    accepted: bool
    previous_response_id: str
    #: The steer's id (``steer_...``); None when it was refused at once.
    id: str | None
    #: ``{"code", "message", "type"}`` when refused.
    error: SteerError | None
    #: The steering input handed back as it was sent (empty when accepted).
    input: list[JSONObject]
    raw: JSONObject = field(repr=False)

    @classmethod
    def from_event(cls, event: JSONObject) -> SteerAck:
        """From a ``response.steer.accepted`` or ``response.steer.failed`` event."""
        steer = event["steer"]
        return cls(
            accepted=event["type"] == "response.steer.accepted",
            previous_response_id=steer["previous_response_id"],
            id=steer.get("id"),
            error=event.get("error"),
            input=steer.get("input") or [],
            raw=event,
        )

    @property
    def code(self) -> str | None:
        """The failure code (None when accepted)."""
        return self.error.get("code") if self.error else None


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage of a response."""

    input_tokens: int
    cached_tokens: int
    output_tokens: int
    total_tokens: int

    @classmethod
    def from_dict(cls, usage: UsageObject | None) -> Usage | None:
        """From the JSON usage object (None stays None)."""
        if not usage:
            return None
        return cls(
            usage["input_tokens"],
            usage["input_tokens_details"]["cached_tokens"],
            usage["output_tokens"],
            usage["total_tokens"],
        )


@dataclass(frozen=True, slots=True)
class Response:
    """A finished (or paused, in append mode) response."""

    id: str
    status: ResponseStatus
    #: The output items, narrowed by ``item["type"]``.
    output: list[Item]
    usage: Usage | None
    #: The server's counters of this response (``StatsObject``); empty when it sent none.
    stats: JSONMapping
    previous_response_id: str | None
    error: ResponseError | None
    incomplete_reason: str | None
    safety_flags: list[SafetyFlagObject]
    raw: ResponseObject = field(repr=False)
    #: Append mode: the calls a paused response (``response.done``) waits on.
    pending_calls: list[FunctionCallItem] = field(default_factory=list)

    @classmethod
    def from_dict(
        cls, response: ResponseObject, pending_calls: list[FunctionCallItem] | None = None
    ) -> Response:
        """From the JSON Response object."""
        incomplete = response.get("incomplete_details")
        return cls(
            id=response["id"],
            status=response["status"],
            output=response.get("output") or [],
            usage=Usage.from_dict(response.get("usage")),
            stats=response.get("stats") or {},
            previous_response_id=response.get("previous_response_id"),
            error=response.get("error"),
            incomplete_reason=incomplete.get("reason") if incomplete else None,
            safety_flags=response.get("safety_flags") or [],
            raw=response,
            pending_calls=pending_calls or [],
        )

    @property
    def steered(self) -> bool:
        """Steering input stopped it (``incomplete``, reason ``steered``); its automatic
        successor follows on the same lane (``ConnectStream.follow``)."""
        return self.status == "incomplete" and self.incomplete_reason == "steered"

    @property
    def function_calls(self) -> list[FunctionCallItem]:
        """The function_call items of the output (or the pending calls in append mode)."""
        if self.pending_calls:
            return self.pending_calls
        return [item for item in self.output if _is_function_call(item)]

    def call_output(self, output: str, index: int = 0) -> FunctionCallOutputItem:
        """The input item answering function call ``index`` with ``output`` (the next turn's
        input in a tool loop)."""
        call_id = self.function_calls[index]["call_id"]
        return {"type": "function_call_output", "call_id": call_id, "output": output}

    @property
    def output_text(self) -> str:
        """All output_text of the output's messages, concatenated."""
        return "".join(
            part.get("text", "")
            for item in self.output
            if _is_message(item)
            for part in item.get("content", ())
            if _is_output_text(part)
        )


# ``.get("type")`` rather than ``["type"]``: an item of a kind newer than this client's proto
# decodes as ``{}`` (``codec.checked_item_to_dict``), and is skipped rather than a KeyError.
def _is_function_call(item: Item) -> TypeGuard[FunctionCallItem]:
    return item.get("type") == "function_call"


def _is_message(item: Item) -> TypeGuard[MessageItem]:
    return item.get("type") == "message"


def _is_output_text(part: ContentPart) -> TypeGuard[OutputTextPart]:
    return part.get("type") == "output_text"
