"""The ``Connect`` stream: one gRPC call is one core ``Session``.

A reader task decodes the client's messages and hands them to the session; the call's
response stream writes what the session emits. A watchdog cuts off a client that stopped
reading. Whatever ends the call, the session is closed in ``finally``, which cancels in-flight
engine work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator

import grpc
from bidi_responses.codec import ProtoDecoder
from bidi_responses.server.core.api.errors import ApiError
from bidi_responses.server.core.lanes.session import Session
from bidi_responses.server.core.runs.record import error_event
from bidi_responses.server.core.service import ResponsesCore
from bidi_responses.server.core.tenancy.limits import limit_exceeded
from bidi_responses.server.core.tenancy.request_budget import GRPC_COPIES
from bidi_responses.server.transports.admission import shutting_down
from bidi_responses.server.transports.grpc.context import Context, caller_of
from bidi_responses.server.transports.grpc.decoding import decode_request, peek_connect_request
from bidi_responses.server.transports.grpc.delivery import Delivery, Outbound
from bidi_responses.server.transports.grpc.status import abort
from bidi_responses.v1 import responses_pb2 as pb

log = logging.getLogger("bidi_responses.grpc")

# How long a refused Connect call waits for the client's first message before its status.
_REFUSAL_READ_S = 1.0


def _write_timeout(seconds: float) -> ApiError:
    """The status of a stream cut off because its client stopped reading."""
    return ApiError(
        f"The client read nothing for {seconds:g} s (write timeout); the stream was closed "
        "and its in-flight responses cancelled.",
        code="write_timeout",
        status=429,
        type="server_error",
    )


class StreamsPerConnection:
    """Open Connect streams per HTTP/2 connection (the peer address names the connection).

    A transport matter the core cannot see, so the gRPC server keeps it; bounded by the open
    streams themselves (an entry goes when its last stream ends).
    """

    def __init__(self, core: ResponsesCore) -> None:
        self._core = core
        self._open: dict[str, int] = {}

    def check(self, peer: str) -> None:
        """ApiError 429 if ``peer`` already has the most streams allowed."""
        limit = self._core.config.tenant_limits.max_streams_per_connection
        if limit and self._open.get(peer, 0) >= limit:
            self._core.metrics.limited.labels("max_streams_per_connection").inc()
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


class _WriteWatch:
    """Cuts off a client that stopped reading: a write waits while HTTP/2 flow control says the
    client's window is full, and one pending for the write timeout ends the stream."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        # When the pending write began (None: none pending), on the event loop's clock.
        self.started: float | None = None

    async def wait_for_stall(self) -> None:
        """Return once a write has been pending for the write timeout."""
        loop = asyncio.get_running_loop()
        while True:
            started = self.started
            wait = self.timeout / 4
            if started is not None:
                wait = min(wait, started + self.timeout - loop.time())
                if wait <= 0:
                    return
            await asyncio.sleep(wait)


async def _read_requests(
    context: Context, session: Session, outbound: Outbound, core: ResponsesCore
) -> None:
    """Feed the client's messages to the session until the client half-closes."""
    decoder = ProtoDecoder()
    streaming = core.config.streaming
    try:
        # context.read() rather than request_iterator: grpc's iterator keeps the last message
        # alive while it waits for the next, and an idle stream must not hold its last message
        # (it may be megabytes of input the cache budget does not see).
        while True:
            raw: object = await context.read()
            if raw is grpc.aio.EOF or not isinstance(raw, bytes):
                break
            received = time.perf_counter()
            size = len(raw) * GRPC_COPIES
            try:
                # Charged to the server-wide budget until the session has taken the event.
                core.request_bytes.take(size)
            except ApiError as error:
                lane, answers = peek_connect_request(raw)
                del raw
                refused = error_event(error.status, error.to_error_object(), answers)
                await session.emit(lane, refused)
                continue
            try:
                request = decode_request(pb.ConnectRequest, raw, "Connect")
                # A create's tools, found again by their bytes; other messages (appends of
                # tool outputs, steers) are not parsed a second time.
                tool_keys = (
                    decoder.tool_keys(raw)
                    if request.HasField("response_create") and request.response_create.tools
                    else None
                )
            except ApiError as error:
                core.request_bytes.release(size)
                await session.emit("", error_event(400, error.to_error_object()))
                continue
            finally:
                del raw
            if request.HasField("delivery"):
                # Applies to everything the session emits from here on.
                try:
                    delivery = Delivery.from_pb(request.delivery, streaming)
                except ApiError as error:
                    core.request_bytes.release(size)
                    await session.emit(
                        request.stream_id, error_event(error.status, error.to_error_object())
                    )
                    continue
                outbound.use(delivery)
                session.streaming = delivery.streaming(streaming)
                if request.WhichOneof("event") is None:
                    core.request_bytes.release(size)
                    continue  # options only
            event = decoder.client_event(request, tool_keys)
            del request, tool_keys
            try:
                await session.handle(event, received)
            finally:
                core.request_bytes.release(size)
            del event
    except grpc.aio.AbortError:
        # This server ended the call (drain, age limit, write timeout) while it waited for
        # the client's next message: an expected end.
        log.debug("Connect: the call ended while waiting for the client")
    except Exception:
        if context.done():
            # The call is over (the client went away, or the listener stopped): expected.
            log.debug("Connect: the call ended while waiting for the client", exc_info=True)
        else:
            # Reading failed on the server's side: end the call rather than leave it open.
            log.exception("Connect: reading the client's messages failed")
    await session.finish()


async def connect_stream(
    core: ResponsesCore,
    streams: StreamsPerConnection,
    request_iterator: AsyncIterator[bytes],
    context: Context,
) -> AsyncGenerator[bytes, None]:
    """The stateful stream: pre-serialized ``ConnectResponse`` messages out.

    Requests arrive as raw bytes and are decoded here, so one that cannot be decoded becomes
    an ``error`` event and the stream goes on (grpc.aio would otherwise leave the call hanging).
    """
    peer = context.peer()
    try:
        caller = caller_of(core.keys, context)
        if core.draining:
            raise shutting_down("streams")
        streams.check(peer)
        session = core.open_session("grpc", caller=caller)
    except ApiError:
        await _refuse_after_first_message(request_iterator)
        raise
    with streams.counted(peer):
        # Closed with this call, not whenever the garbage collector gets to it.
        async with contextlib.aclosing(_serve_session(core, session, context)) as out:
            async for message in out:
                yield message


async def _serve_session(
    core: ResponsesCore, session: Session, context: Context
) -> AsyncGenerator[bytes, None]:
    """Run an open session over the call until either side ends it; always closes it."""
    outbound = Outbound()
    write_timeout = core.config.limits.write_timeout_s
    # Headers first, on their own: a stalled client must not leave them pending with a large
    # first message, or the status that cuts it off could not be sent.
    await context.send_initial_metadata(())
    loop = asyncio.get_running_loop()
    reader = loop.create_task(
        _read_requests(context, session, outbound, core), name="connect-reader"
    )
    session.start_age_limit()
    watch = _WriteWatch(write_timeout)

    async def cut_off_stalled_client() -> None:
        await watch.wait_for_stall()
        core.counters.write_timeouts += 1
        await core.close_session(session)  # cancels in-flight engine work
        with contextlib.suppress(Exception):
            await abort(context, _write_timeout(write_timeout))

    watchdog = loop.create_task(cut_off_stalled_client(), name="connect-write-watch")
    try:
        # Take every event that is ready; one message each, or batched if asked for.
        async for ready in session.event_batches(core.config.streaming.max_batch_events):
            for message in outbound.messages(ready):
                watch.started = loop.time()
                yield message
                watch.started = None
        if session.end_error is not None:
            # The server ended the stream (age limit, drain): a status that says so, so
            # clients and meshes retry elsewhere instead of reading it as success.
            await abort(context, session.end_error)
    finally:
        watchdog.cancel()
        reader.cancel()
        await asyncio.gather(reader, watchdog, return_exceptions=True)
        await core.close_session(session)  # cancels in-flight engine work
