"""What the core offers its transports: all they may use of it.

The application (``server/app.py``) builds the core and hands each transport one
``TransportPort``: a ``StreamPort`` that opens and closes stream sessions, a ``OneShotPort``
for the calls without a stream (create, retrieve, cancel, delete, input items, compact, token
counts, models, background events, stats), and the parts the transport uses itself (API keys,
its limits, metrics and counters, the server-wide request budget). How the transport names
what the core reports on it, and what its requests cost, come with it as data
(``TransportNaming``): the core never asks which transport it serves.

Only types are imported here, so that the core's package can offer them without loading it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from bidi_responses.schema import (
        CompactionResponse,
        DeletedResponse,
        InputItemList,
        InputTokensCount,
        JSONObject,
        JSONValue,
        ModelList,
        ModelObject,
        ResponseObject,
        ServerEvent,
    )

    from ..config import Limits, StreamingConfig
    from .api import ApiError, ClientEvent
    from .lanes import StreamNaming
    from .observability import Counters, Metrics, ServerStats
    from .runs import OutEvent
    from .tenancy import ApiKeys, Caller, RequestBytes


@dataclass(frozen=True, slots=True)
class TransportNaming:
    """How one transport names its calls to the core, and what its requests cost."""

    # Its streams (a Connect call, a WebSocket connection).
    stream: StreamNaming
    # Its calls without a stream, as metrics and the usage ledger label them.
    one_shot: str
    # Copies of a request the server holds at once while it reads and parses it (the buffer
    # as it grows, the payload cut from it, its decoded forms): the request budget charges
    # that many times its bytes, so that it bounds memory, not just bytes on the wire.
    stream_copies: int
    one_shot_copies: int


class StreamSession(Protocol):
    """One stream's session, as its transport drives it."""

    # Why the server ended the stream (age limit, drain), for the transport's final status.
    end_error: ApiError | None
    # How engine output becomes deltas (a client may ask for a coarser window).
    streaming: StreamingConfig

    @property
    def transport(self) -> str:
        """The transport's label (``StreamNaming.transport``)."""
        ...

    def start_age_limit(self) -> None:
        """Warn before, and end the stream at, the connection age limit."""
        ...

    async def handle_event(self, event: ClientEvent, received: float | None = None) -> None:
        """Act on one client event."""
        ...

    async def emit(self, lane: str, data: ServerEvent) -> None:
        """Queue a server event for the client."""
        ...

    def event_batches(self, max_events: int) -> AsyncIterator[list[OutEvent]]:
        """What the stream sends, in order, to its end, as lists of what is ready together."""
        ...

    async def finish(self, *, wait_for_runs: bool = True) -> None:
        """End the stream once its in-flight responses have ended (or at once)."""
        ...


class StreamPort(Protocol):
    """Opens and closes stream sessions."""

    @property
    def draining(self) -> bool:
        """True once a drain began: new streams are refused."""
        ...

    def open_session(self, naming: StreamNaming, *, caller: Caller) -> StreamSession:
        """A new session; ApiError 429 if ``caller`` has too many streams open."""
        ...

    async def close_session(self, session: StreamSession) -> None:
        """Release a session (in a finally block): its in-flight work stops."""
        ...


class OneShotPort(Protocol):
    """The calls without a stream."""

    @property
    def draining(self) -> bool:
        """True once a drain began: new responses are refused."""
        ...

    def respond(
        self, body: JSONObject, transport: str, caller: Caller
    ) -> AsyncGenerator[ServerEvent, None]:
        """One create's events, up to and including the terminal one."""
        ...

    def respond_batches(
        self, body: JSONObject, transport: str, caller: Caller, max_events: int = 1
    ) -> AsyncGenerator[list[ServerEvent], None]:
        """``respond`` as lists of the events ready together."""
        ...

    async def start_background(
        self, body: JSONObject, transport: str, caller: Caller
    ) -> ServerEvent:
        """Start a background response; its first event."""
        ...

    def background_events(
        self, response_id: str, starting_after: int, tenant: str | None
    ) -> AsyncIterator[ServerEvent]:
        """A background response's kept events after ``starting_after``, live to the end."""
        ...

    def is_background(self, response_id: str, tenant: str | None) -> bool:
        """Whether the events of ``response_id`` are kept as a background response's."""
        ...

    async def get_response(self, response_id: str, tenant: str | None = None) -> ResponseObject:
        """A stored response."""
        ...

    async def delete_response(self, response_id: str, tenant: str | None = None) -> DeletedResponse:
        """Delete a stored response."""
        ...

    async def list_input_items(
        self,
        response_id: str,
        *,
        limit: int = 20,
        order: str = "desc",
        after: str | None = None,
        tenant: str | None = None,
    ) -> InputItemList:
        """One page of a stored response's input items."""
        ...

    async def cancel_response(self, response_id: str, tenant: str | None = None) -> ResponseObject:
        """Cancel an in-flight response; it as it ended."""
        ...

    async def compact(self, raw: JSONValue, transport: str, caller: Caller) -> CompactionResponse:
        """Compact a conversation."""
        ...

    async def count_input_tokens(self, raw: JSONValue, tenant: str | None) -> InputTokensCount:
        """The prompt tokens a create with this body would use."""
        ...

    def list_models(self) -> ModelList:
        """The models served."""
        ...

    def get_model(self, model_id: str) -> ModelObject:
        """One model served."""
        ...

    def rate_limit_headers(self, quota_key: str) -> dict[str, str]:
        """The caller's ``x-ratelimit-*`` headers."""
        ...

    def stats(self) -> ServerStats:
        """This process's counters."""
        ...


@dataclass(frozen=True, slots=True)
class TransportPort:
    """What the application hands one transport."""

    streams: StreamPort
    one_shot: OneShotPort
    naming: TransportNaming
    # The credentials it checks.
    keys: ApiKeys
    limits: Limits
    streaming: StreamingConfig
    metrics: Metrics
    counters: Counters
    # Request bytes read or held at once, over every transport.
    request_bytes: RequestBytes
    # Registers what to call once when a drain begins (health turns NOT_SERVING).
    on_drain: Callable[[Callable[[], None]], None]
