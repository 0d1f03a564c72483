"""SSE responses: a response's events as a stream, cut off when the client stops reading."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextvars import ContextVar

from bidi_responses.schema import JSONValue, ServerEvent
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from ...core import TransportPort
from ..streams import WatchedWrites, WriteWatch
from .framing import SSE_HEADERS, flat_sse_error, sse_frame

# Set in the task that served a request whose SSE stream the write timeout cut off (the task
# in which the HTTP server then reports the response's end).
_CUT_OFF: ContextVar[bool] = ContextVar("sse_cut_off", default=False)


class _CutOffLogFilter(logging.Filter):
    """uvicorn logs a response that the application ended before its last chunk as an ERROR
    ("returned without completing response"). An SSE stream cut off by the write timeout ends
    that way on purpose: that request's record becomes one INFO line. Any other response left
    incomplete is still an ERROR."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _CUT_OFF.get() and "returned without completing response" in record.getMessage():
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg = "SSE: a client stopped reading; its stream was cut off (write timeout)"
            record.args = ()
        return True


#: What SSE filters in uvicorn's error log (installed by ``server.start_http_server``).
LOG_FILTERS: tuple[logging.Filter, ...] = (_CutOffLogFilter(),)


class SseResponse(StreamingResponse):
    """An SSE response whose writes give up after the write timeout: a client that stopped
    reading loses its connection, and its response is cancelled (the event iterator closes)."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        core: TransportPort,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(
            content, media_type="text/event-stream", headers={**SSE_HEADERS, **(headers or {})}
        )
        self._core = core
        self._cut_off = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)
        if self._cut_off:  # (streamed in a task of its own: the mark is set in this one)
            _CUT_OFF.set(True)

    async def stream_response(self, send: Send) -> None:
        """Stream the events under the stream driver's write watch; a write pending for the
        write timeout stops the stream (the connection drops, counted once)."""
        limits = self._core.limits

        async def writes(watch: WriteWatch) -> None:
            async def watched_send(message: Message) -> None:
                watch.begin()
                await send(message)
                watch.end()

            await super(SseResponse, self).stream_response(watched_send)

        try:
            self._cut_off = await WatchedWrites(
                writes, limits.write_timeout_s, self._core.counters, "sse-writer"
            ).wait()
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()


async def sse_stream(
    first: Mapping[str, JSONValue], events: AsyncGenerator[ServerEvent, None]
) -> AsyncIterator[bytes]:
    """SSE frames of one response; the core's iterator stops after the terminal event.

    No ``data: [DONE]`` follows: OpenAI omits it and the SDK does not need it.
    """
    async with contextlib.aclosing(events):
        yield sse_frame(first)
        last = _sequence_number(first, 0)
        async for event in events:
            data = flat_sse_error(event, last + 1) if event["type"] == "error" else event
            last = _sequence_number(data, last)
            yield sse_frame(data)


def _sequence_number(event: Mapping[str, JSONValue], default: int) -> int:
    """The event's ``sequence_number`` (the core's nested error event has none)."""
    number = event.get("sequence_number", default)
    return number if isinstance(number, int) else default


def event_log_response(events: AsyncIterator[ServerEvent]) -> StreamingResponse:
    """A background response's event log as SSE. Reading a log: a client going away cancels
    nothing, so no write timeout applies."""

    async def frames() -> AsyncIterator[bytes]:
        async for data in events:
            yield sse_frame(data)

    return StreamingResponse(frames(), media_type="text/event-stream", headers=SSE_HEADERS)
