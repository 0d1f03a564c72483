"""The events of steering and injection, as WebSocket mode's official SDKs type them: input
a client adds to a response in flight, accepted, refused, or waiting for its tool outputs.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypeAlias, TypedDict

from .json_types import JSONValue


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
