"""Client events, typed once at the core's edge.

WebSocket mode's JSON events are typed by ``parse_json_event`` (the shape checks, the lane,
then ``parse_client_event``), which raises ``EventRefused`` naming the field and the lane its
error goes to; Connect's protobuf messages become the same typed events in the gRPC transport
(``transports/grpc/connect_events.py``), with the same checks. A steer is the exception: its
problems are answered with ``response.steer.failed`` rather than an ``error`` event, so
``parse_steer`` returns them as data (``SteerEvent.problem``).

Each event says what an error answering it names (``answers``: the event's type, the client's
``event_id`` and the response it concerns). A create's ``event_id`` is in its body (the run's
own errors answer it too); an append or a cancel carries its own; a steer or an inject takes
none (their answers name their target).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypeAlias

from bidi_responses.schema import JSONObject, JSONValue

from ...config import Limits
from .errors import ApiError, server_error
from .input_items import parse_input
from .jsonshape import check_json_shape

_STREAM_ID = re.compile(r"[A-Za-z0-9_.-]{1,256}")
CLIENT_EVENT_TYPES = (
    "response.create",
    "response.append",
    "response.cancel",
    "response.steer",
    "response.inject",
)
_STEER_KEYS = frozenset({"type", "previous_response_id", "input"})
_STEER_MESSAGE_KEYS = frozenset({"type", "role", "content"})
_STEER_PART_TYPES = frozenset({"input_text", "input_image", "input_file"})


#: What an error answering a client event names: ``request_type`` (the event's type), the
#: client's ``event_id`` and the ``response_id`` concerned; None where the event has none.
Answers: TypeAlias = dict[str, str | None]


def answering(kind: str, event_id: str | None, response_id: str | None) -> Answers:
    """What an error answering a ``kind`` event names (also for an event refused before it
    could be typed)."""
    return {"request_type": kind, "event_id": event_id, "response_id": response_id}


@dataclass(frozen=True, slots=True)
class CreateEvent:
    """``response.create``: ``body`` is the create body without ``type`` and ``stream_id``
    (its ``event_id`` stays in it: the run's own errors answer it too)."""

    lane: str
    body: JSONObject

    @property
    def event_id(self) -> str | None:
        return _event_id(self.body)

    @property
    def answers(self) -> Answers:
        previous = self.body.get("previous_response_id")
        parent = previous if isinstance(previous, str) else None
        return answering("response.create", self.event_id, parent)


@dataclass(frozen=True, slots=True)
class AppendEvent:
    """``response.append`` (this project's append mode): tool outputs for a waiting response."""

    lane: str
    response_id: str
    input: JSONValue
    event_id: str | None = None

    @property
    def answers(self) -> Answers:
        return answering("response.append", self.event_id, self.response_id)


@dataclass(frozen=True, slots=True)
class CancelEvent:
    """``response.cancel``: stop the lane's in-flight response (``response_id`` if given)."""

    lane: str
    response_id: str | None
    event_id: str | None = None

    @property
    def answers(self) -> Answers:
        return answering("response.cancel", self.event_id, self.response_id)


@dataclass(frozen=True, slots=True)
class SteerProblem:
    """Why a steer is refused before it gets an id (``response.steer.failed``)."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class SteerEvent:
    """``response.steer``: input for the automatic successor of ``previous_response_id``.

    ``input`` is the input as sent (returned in ``response.steer.failed``); ``items`` the
    normalized user messages; ``problem`` set when the event cannot be accepted as sent.
    """

    previous_response_id: str
    input: JSONValue
    items: tuple[JSONObject, ...]
    problem: SteerProblem | None = None

    @property
    def answers(self) -> Answers:
        return answering("response.steer", None, self.previous_response_id)


@dataclass(frozen=True, slots=True)
class InjectEvent:
    """``response.inject`` (beta): client tool outputs for a response waiting for them."""

    response_id: str
    input: JSONValue

    @property
    def answers(self) -> Answers:
        return answering("response.inject", None, self.response_id)


ClientEvent: TypeAlias = CreateEvent | AppendEvent | CancelEvent | SteerEvent | InjectEvent


class EventRefused(Exception):
    """A client event that cannot be typed: the error to answer, on the lane it goes to
    (``""`` when the lane itself is in doubt). Raised from a server fault (``__cause__``), the
    error is a generic 500."""

    def __init__(self, lane: str, error: ApiError) -> None:
        super().__init__(error.message)
        self.lane = lane
        self.error = error


def lane_of(event: JSONObject) -> str:
    """The event's lane (``""``: the default lane); ApiError for a bad ``stream_id``."""
    raw = event.get("stream_id")
    if raw is not None and not isinstance(raw, str):
        raise ApiError(
            "Invalid 'stream_id': expected a string.", code="invalid_type", param="stream_id"
        )
    return lane_named(raw or "")


def lane_named(stream_id: str) -> str:
    """The lane a ``stream_id`` string names; ApiError unless it follows the rule."""
    if stream_id and not _STREAM_ID.fullmatch(stream_id):
        # The hosted WebSocket mode's rule; "" stays the default lane (proto3 default).
        raise ApiError(
            "Invalid 'stream_id': expected 1 to 256 characters of [A-Za-z0-9_.-].",
            code="invalid_stream_id",
            param="stream_id",
        )
    return stream_id


def parse_json_event(event: JSONValue, limits: Limits) -> ClientEvent:
    """One JSON client event, checked and typed (``EventRefused`` when it cannot be)."""
    lane = ""
    try:
        if not isinstance(event, dict):
            raise ApiError("Each client event must be a JSON object.", code="invalid_type")
        # Nesting and numbers first: every later step may then walk the event freely.
        check_json_shape(event)
        if event.get("type") not in ("response.steer", "response.inject"):
            lane = lane_of(event)
        return parse_client_event(event, limits)
    except ApiError as error:
        raise EventRefused(lane, error) from None
    except Exception as fault:
        raise EventRefused(lane, server_error()) from fault


def parse_client_event(event: JSONObject, limits: Limits) -> ClientEvent:
    """The typed form of one client event (already checked by ``check_json_shape``)."""
    kind = event.get("type")
    if kind == "response.steer":
        return parse_steer(event, limits)
    if kind == "response.inject":
        return _parse_inject(event)
    lane = lane_of(event)
    if kind == "response.create":
        return CreateEvent(lane, {k: v for k, v in event.items() if k not in ("type", "stream_id")})
    if kind == "response.append":
        return AppendEvent(lane, _response_id(event), event.get("input"), _event_id(event))
    if kind == "response.cancel":
        response_id = event.get("response_id")
        given = response_id if isinstance(response_id, str) and response_id else None
        return CancelEvent(lane, given, _event_id(event))
    if kind is None:
        raise ApiError(
            "Missing required parameter: 'type'.", code="missing_required_parameter", param="type"
        )
    if not isinstance(kind, str):
        raise ApiError(
            f"Invalid 'type': expected a string, got {type(kind).__name__}.",
            code="invalid_type",
            param="type",
        )
    raise ApiError(
        f"Invalid 'type': unknown client event '{kind}' (expected one of "
        f"{', '.join(CLIENT_EVENT_TYPES)}).",
        code="unknown_event_type",
        param="type",
    )


def _response_id(event: JSONObject) -> str:
    response_id = event.get("response_id")
    if not isinstance(response_id, str) or not response_id:
        raise ApiError(
            "Missing required parameter: 'response_id'.",
            code="missing_required_parameter",
            param="response_id",
        )
    return response_id


def _parse_inject(event: JSONObject) -> InjectEvent:
    extra = sorted(set(event) - {"type", "response_id", "input"})
    if extra:
        raise ApiError(
            f"Unknown parameter: '{extra[0]}': response.inject takes only type, response_id "
            "and input.",
            code="unknown_parameter",
            param=extra[0],
        )
    raw = event.get("input")
    if not isinstance(raw, list) or not raw:
        raise ApiError(
            "Invalid 'input': expected a non-empty array of input items.",
            code="invalid_type" if not isinstance(raw, list) else "empty_array",
            param="input",
        )
    return InjectEvent(_response_id(event), raw)


def parse_steer(event: JSONObject, limits: Limits) -> SteerEvent:
    """A steer, checked as the hosted API checks it: exactly ``type``,
    ``previous_response_id`` and ``input``; ``input`` a string or a non-empty list of user
    messages whose content is a string or input_text/input_image/input_file parts."""
    raw_previous = event.get("previous_response_id")
    previous = raw_previous if isinstance(raw_previous, str) else ""
    raw_input = event.get("input")

    def refused(message: str) -> SteerEvent:
        return SteerEvent(previous, raw_input, (), SteerProblem("invalid_input", message))

    extra = sorted(set(event) - _STEER_KEYS)
    if extra:
        hint = " (the target response's lane is used)" if extra[0] == "stream_id" else ""
        return refused(
            f"Unknown parameter: '{extra[0]}': response.steer takes only type, "
            f"previous_response_id and input{hint}."
        )
    if not previous:
        return refused("Missing required parameter: 'previous_response_id' (a non-empty string).")
    if "input" not in event:
        return refused("Missing required parameter: 'input'.")
    problem = _steer_input_problem(raw_input)
    if problem is not None:
        return refused(problem)
    try:
        items, _ = parse_input(raw_input, limits)
    except ApiError as error:
        return refused(error.message)
    return SteerEvent(previous, raw_input, tuple(dict(item) for item in items))


def _steer_input_problem(raw: JSONValue) -> str | None:
    """What makes ``raw`` unfit as steering input, naming the field; None if it fits."""
    if isinstance(raw, str):
        return None if raw else "Invalid 'input': expected a non-empty string."
    if not isinstance(raw, list):
        return "Invalid 'input': expected a string or an array of user messages."
    if not raw:
        return "Invalid 'input': expected a non-empty array of user messages."
    for index, entry in enumerate(raw):
        where = f"input[{index}]"
        if not isinstance(entry, dict):
            return f"Invalid '{where}': expected a message object."
        kind = entry.get("type", "message")
        if kind != "message":
            return (
                f"Invalid '{where}.type': steering accepts only user messages, not '{kind}' "
                "(send tool outputs in response.create)."
            )
        if entry.get("role") != "user":
            return f"Invalid '{where}.role': steering accepts only the 'user' role."
        extra = sorted(set(entry) - _STEER_MESSAGE_KEYS)
        if extra:
            return (
                f"Invalid '{where}.{extra[0]}': steering messages take only type, role and content."
            )
        content = entry.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list) or not content:
            return f"Invalid '{where}.content': expected a string or a non-empty array of parts."
        for part_index, part in enumerate(content):
            part_type = part.get("type") if isinstance(part, dict) else None
            if part_type not in _STEER_PART_TYPES:
                return (
                    f"Invalid '{where}.content[{part_index}].type': expected input_text, "
                    "input_image or input_file."
                )
    return None


def _event_id(event: JSONObject) -> str | None:
    """The client's ``event_id`` (echoed by errors that answer the event), if a string."""
    event_id = event.get("event_id")
    return event_id if isinstance(event_id, str) and event_id else None
