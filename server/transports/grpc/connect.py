"""The ``Connect`` stream: one gRPC call is one core session, run by the stream driver.

This adapter only translates framing (``ConnectWire``): ``ConnectRequest`` bytes in, decoded
here into the core's typed client events (``connect_events.py``), and pre-serialized
``ConnectResponse`` messages out, one per event or batched as the client's ``DeliveryOptions``
ask. What grpc.aio needs is kept here too: headers before the first message, a refusal sent
after the client's first message, and the client's messages read with ``context.read()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator, Sequence

import grpc
from bidi_responses.codec import ProtoDecoder
from bidi_responses.v1 import responses_pb2 as pb

from ...core import StreamSession, TransportPort
from ...core.api import ApiError
from ...core.observability import Metrics
from ...core.runs import OutEvent
from ...core.tenancy import limit_exceeded
from ..streams import (
    Incoming,
    Refusal,
    StreamDriver,
    open_stream,
)
from .connect_events import connect_event
from .context import Context, caller_of
from .decoding import decode_request, peek_connect_request
from .delivery import Delivery, Outbound
from .status import abort

log = logging.getLogger("bidi_responses.grpc")

# How long a refused Connect call waits for the client's first message before its status.
_REFUSAL_READ_S = 1.0


class StreamsPerConnection:
    """Open Connect streams per HTTP/2 connection (the peer address names the connection).

    A transport matter the core cannot see, so the gRPC server keeps it; bounded by the open
    streams themselves (an entry goes when its last stream ends).
    """

    def __init__(self, limit: int, metrics: Metrics) -> None:
        # 0: no limit.
        self._limit = limit
        self._metrics = metrics
        self._open: dict[str, int] = {}

    def check(self, peer: str) -> None:
        """ApiError 429 if ``peer`` already has the most streams allowed."""
        limit = self._limit
        if limit and self._open.get(peer, 0) >= limit:
            self._metrics.limited.labels("max_streams_per_connection").inc()
            raise limit_exceeded("max_streams_per_connection", limit, "open streams per connection")

    @contextlib.contextmanager
    def counted(self, peer: str) -> Iterator[None]:
        """Count one stream of ``peer`` while the block runs."""
        self._open[peer] = self._open.get(peer, 0) + 1
        try:
            yield
        finally:
            left = self._open.get(peer, 1) - 1
            if left > 0:
                self._open[peer] = left
            else:
                self._open.pop(peer, None)


async def _refuse_after_first_message(request_iterator: AsyncIterator[bytes]) -> None:
    """Let a Connect call that cannot be served see its status: read the client's first
    message (or wait briefly for it), then return so the caller refuses the call.

    A status sent before the client's first write races that write, and grpcio clients then
    report their own INTERNAL instead of our status.
    """
    with contextlib.suppress(Exception):
        async with asyncio.timeout(_REFUSAL_READ_S):
            await anext(aiter(request_iterator), None)


async def connect_stream(
    core: TransportPort,
    streams: StreamsPerConnection,
    request_iterator: AsyncIterator[bytes],
    context: Context,
) -> None:
    """The stateful stream: ``ConnectRequest`` bytes in, pre-serialized ``ConnectResponse``
    messages out through ``context.write``.

    Requests arrive as raw bytes and are decoded here, so one that cannot be decoded becomes
    an ``error`` event and the stream goes on (grpc.aio would otherwise leave the call hanging).
    """
    peer = context.peer()
    try:
        caller = caller_of(core.keys, context)
        session = open_stream(core, caller, check=lambda: streams.check(peer))
    except ApiError:
        await _refuse_after_first_message(request_iterator)
        raise
    with streams.counted(peer):
        try:
            # Headers first, on their own: a stalled client must not leave them pending with
            # a large first message, or the status that cuts it off could not be sent.
            await context.send_initial_metadata(())
        except BaseException:
            await core.streams.close_session(session)
            raise
        wire = ConnectWire(context, session, core)
        await StreamDriver(core, session, wire).run()


class ConnectWire:
    """A Connect call as the stream driver's wire."""

    half_close = True  # the client may stop sending and still read its responses

    def __init__(self, context: Context, session: StreamSession, core: TransportPort) -> None:
        self._context = context
        self._session = session
        self._limits = core.limits
        self._streaming = core.streaming
        self._copies = core.naming.stream_copies
        self._decoder = ProtoDecoder()
        self._outbound = Outbound()
        # Pre-serialized messages pass through the response serializer unchanged.
        self._write = context.write

    async def receive(self) -> bytes | None:
        context = self._context
        try:
            # context.read() rather than the request iterator: grpc's iterator keeps the last
            # message alive while it waits for the next, and an idle stream must not hold its
            # last message (it may be megabytes of input the cache budget does not see).
            raw: object = await context.read()
        except grpc.aio.AbortError:
            # This server ended the call (drain, age limit, write timeout) while it waited for
            # the client's next message: an expected end.
            log.debug("Connect: the call ended while waiting for the client")
            return None
        except Exception:
            if context.done():
                # The call is over (the client went away, or the listener stopped): expected.
                log.debug("Connect: the call ended while waiting for the client", exc_info=True)
            else:
                # Reading failed on the server's side: end the call rather than leave it open.
                log.exception("Connect: reading the client's messages failed")
            return None
        if raw is grpc.aio.EOF or not isinstance(raw, bytes):
            return None
        return raw

    def size(self, message: bytes) -> int:
        return len(message) * self._copies

    def refused(self, message: bytes, error: ApiError) -> Refusal:
        # Not decoded: its lane and what it answers are read from its top-level fields, so
        # the error reaches the lane that waits for it.
        lane, answers = peek_connect_request(message)
        return Refusal(lane, error, answers)

    def decode(self, message: bytes) -> Incoming | Refusal | None:
        try:
            request = decode_request(pb.ConnectRequest, message, "Connect")
            # A create's tools, found again by their bytes; other messages (appends of tool
            # outputs, steers) are not parsed a second time.
            tool_keys = (
                self._decoder.tool_keys(message)
                if request.HasField("response_create") and request.response_create.tools
                else None
            )
        except ApiError as error:
            return Refusal("", error)
        if request.HasField("delivery"):
            # Applies to everything the session emits from here on.
            try:
                delivery = Delivery.from_pb(request.delivery, self._streaming)
            except ApiError as error:
                return Refusal(request.stream_id, error)
            self._outbound.use(delivery)
            self._session.streaming = delivery.streaming(self._streaming)
            if request.WhichOneof("event") is None:
                return None  # options only
        return connect_event(request, tool_keys, self._limits)

    def frames(self, ready: list[OutEvent]) -> Sequence[bytes]:
        return self._outbound.messages(ready)

    async def send(self, frames: Sequence[bytes]) -> None:
        write = self._write
        for message in frames:
            await write(message)

    async def abort(self, error: ApiError) -> None:
        await abort(self._context, error)

    async def close(self) -> None:
        """The call ends OK when the handler returns."""
