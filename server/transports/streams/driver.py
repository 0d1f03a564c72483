"""The stream driver: one Connect call or WebSocket connection, run as one core session.

Written once for every streaming transport, over its ``Wire``:

- admission (``open_stream``): the draining refusal, a transport's own check, the session;
- the reader: each client message is charged to the server-wide request budget before it is
  decoded and until the session has taken its event; a message that cannot be taken or
  decoded becomes an ``error`` event on the stream, and the stream goes on;
- the writer: what the session has ready, as the wire's frames, under the one write-timeout
  watch (``writes.py``);
- the end: the server's reason (``StreamSession.end_error``: age limit, drain) as the wire's abort,
  else a clean close; a write timeout as its own abort;
- cleanup in ``finally``: the tasks cancelled and the session closed, which cancels in-flight
  engine work.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Generic

from ...core import StreamSession, TransportPort
from ...core.api import ApiError
from ...core.ports import off_loop_from
from ...core.process import uncancelled
from ...core.tenancy import Caller
from ..admission import shutting_down
from .wire import Frame, Message, Refusal, Wire
from .writes import (
    WatchedWrites,
    WriteWatch,
    write_timeout_error,
)

log = logging.getLogger("bidi_responses.streams")
# The core's logger: a client event that cannot be read is reported as the core reports its
# own faults.
core_log = logging.getLogger("bidi_responses")


def open_stream(
    core: TransportPort,
    caller: Caller,
    *,
    refused: str = "streams",
    check: Callable[[], None] | None = None,
) -> StreamSession:
    """A new stream's session; ApiError when it cannot be admitted: the server is draining
    (``refused`` names what it takes no more of), ``check`` refuses it (a transport's own
    limit), or the caller has too many streams open."""
    if core.streams.draining:
        raise shutting_down(refused)
    if check is not None:
        check()
    return core.streams.open_session(core.naming.stream, caller=caller)


class StreamDriver(Generic[Message, Frame]):
    """Runs one admitted session over one wire until either side ends it."""

    def __init__(
        self, core: TransportPort, session: StreamSession, wire: Wire[Message, Frame]
    ) -> None:
        self.core = core
        self.session = session
        self.wire = wire

    async def run(self) -> None:
        """Serve the stream; always closes the session. The wire's abort may raise (a gRPC
        abort does, to end the call)."""
        core, session, wire = self.core, self.session, self.wire
        limits = core.limits
        loop = asyncio.get_running_loop()
        reader = loop.create_task(self._read(), name=f"{session.transport}-reader")
        writes = WatchedWrites(
            self._write, limits.write_timeout_s, core.counters, f"{session.transport}-writer"
        )
        session.start_age_limit()
        try:
            # With a half-close, the end of input lets in-flight responses finish (the reader
            # finishes the session) and the writer's end is the stream's end; otherwise the
            # client went away, and the reader's end is the stream's end too.
            waiting: set[asyncio.Task[Any]] = set(writes.tasks)
            if not wire.half_close:
                waiting.add(reader)
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if writes.watch.done():
                await writes.cut_off()
                await core.streams.close_session(session)  # cancels in-flight engine work
                await wire.abort(write_timeout_error(writes.timeout))
            elif writes.writer.done():
                problem = writes.writer.exception()
                if problem is not None:
                    # The connection failed under a write: the client is gone.
                    log.debug("%s: a write failed", session.transport, exc_info=problem)
                elif session.end_error is not None:
                    # The server ended the stream (age limit, drain): a status that says so,
                    # so clients and meshes retry elsewhere instead of reading it as success.
                    await wire.abort(session.end_error)
                else:
                    await wire.close()
        finally:
            # Run whole even if this handler is cancelled meanwhile (a client that cancels
            # right after an error event): a session left open is counted against its tenant.
            await uncancelled(self._end(reader, writes))

    async def _end(self, reader: asyncio.Task[None], writes: WatchedWrites) -> None:
        """Stop the reader and the writer, and close the session (which cancels in-flight
        engine work)."""
        reader.cancel()
        try:
            await writes.stop()
            await asyncio.gather(reader, return_exceptions=True)
        finally:
            await self.core.streams.close_session(self.session)

    async def _read(self) -> None:
        """Feed the client's messages to the session until it sends no more; then, if the
        client can still read, let the session finish its in-flight responses."""
        try:
            await self._read_messages()
        except Exception:
            # A fault on the server's side: end the input rather than leave the stream open.
            log.exception("%s: reading the client's messages failed", self.session.transport)
        if self.wire.half_close:
            await self.session.finish()

    async def _read_messages(self) -> None:
        session, wire = self.session, self.wire
        budget = self.core.request_bytes
        offload_bytes = self.core.limits.offload_chars
        while True:
            message = await wire.receive()
            if message is None:
                return
            received = time.perf_counter()
            size = wire.size(message)
            try:
                # Charged to the server-wide budget until the session has taken the event.
                budget.take(size)
            except ApiError as error:
                refusal = wire.refused(message, error)
                del message
                await session.emit(refusal.lane, refusal.event())
                continue
            try:
                # A large message is decoded and checked in a worker thread (creates, steers
                # and injects alike), as a large create's rendering is: every other stream
                # keeps being served meanwhile.
                decoded = await off_loop_from(size, offload_bytes, wire.decode, message)
            except BaseException:
                budget.release(size)
                raise
            finally:
                # An idle stream must not keep its last message (it may be megabytes of input
                # that the cache budget does not see) alive in this frame.
                del message
            if decoded is None or isinstance(decoded, Refusal):
                budget.release(size)
                if decoded is not None:
                    await self._refuse(decoded)
                continue
            try:
                await session.handle_event(decoded.event, received)
            finally:
                budget.release(size)
            del decoded

    async def _refuse(self, refusal: Refusal) -> None:
        session = self.session
        if refusal.fault is not None:
            core_log.error(
                "client event unreadable on a %s stream", session.transport, exc_info=refusal.fault
            )
        await session.emit(refusal.lane, refusal.event())

    async def _write(self, watch: WriteWatch) -> None:
        """Write what the session emits until it ends: every event that is ready, as frames."""
        wire, session = self.wire, self.session
        frames, send = wire.frames, wire.send
        begin, end = watch.begin, watch.end
        # The loop drops what it sent before waiting for more: an idle stream must not hold
        # its last events (a terminal event carries the whole response) or their frames.
        # Each send is watched by the write timeout.
        async for ready in session.event_batches(self.core.streaming.max_batch_events):
            begin()
            await send(frames(ready))
            end()
            del ready
