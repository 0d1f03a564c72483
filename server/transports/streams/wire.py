"""The wire interface a streaming transport implements for the stream driver.

An adapter only translates framing: it reads the client's next message, says how many bytes
it charges, decodes it into a typed client event (or a refusal), encodes events that are
ready into frames, sends one frame, and ends the stream with a status or a clean close.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from bidi_responses.schema import ErrorEvent

from ...core.api import ApiError, ClientEvent
from ...core.runs import OutEvent, error_event


@dataclass(frozen=True, slots=True)
class Incoming:
    """A decoded client message: the typed event (which says what its errors answer)."""

    event: ClientEvent


@dataclass(frozen=True, slots=True)
class Refusal:
    """A client message refused before the session saw it: an ``error`` event on ``lane``,
    and the stream goes on. ``fault`` is the server fault behind a generic 500 (logged)."""

    lane: str
    error: ApiError
    answers: Mapping[str, object] | None = None
    fault: BaseException | None = None

    def event(self) -> ErrorEvent:
        return error_event(self.error.status, self.error.to_error_object(), self.answers)


# What a wire reads (a raw message) and writes (a frame), as the transport has them.
Message = TypeVar("Message")
Frame = TypeVar("Frame")


class Wire(Protocol[Message, Frame]):
    """One stream's connection, as the driver sees it."""

    #: Whether the client can still read after it stopped sending (a gRPC half-close): the
    #: stream then ends when its in-flight responses have; otherwise input's end is the end.
    half_close: bool

    async def receive(self) -> Message | None:
        """The client's next message; None once it sends no more (or the connection ended).
        Reading problems on the transport's side are logged here and end the input."""
        ...

    def size(self, message: Message) -> int:
        """The bytes ``message`` holds in memory until the session has taken it."""
        ...

    def refused(self, message: Message, error: ApiError) -> Refusal:
        """The refusal of a message that is not decoded (the request budget is full)."""
        ...

    def decode(self, message: Message) -> Incoming | Refusal | None:
        """The typed event of ``message``, its refusal, or None when it asks for nothing the
        session acts on (only options)."""
        ...

    def frames(self, ready: list[OutEvent]) -> Sequence[Frame]:
        """The events that are ready together as frames (one each, or batched)."""
        ...

    async def send(self, frames: Sequence[Frame]) -> None:
        """Write ``frames`` in order (the events that were ready together); waits while the
        client's window or the socket's buffer is full."""
        ...

    async def abort(self, error: ApiError) -> None:
        """End the stream with ``error``'s status (or close code): the server ended it."""
        ...

    async def close(self) -> None:
        """End the stream cleanly: everything was sent."""
        ...
