"""WebSocket mode: ``GET /v1/responses`` with ``Upgrade: websocket``.

One ``Session`` per connection, exactly like one gRPC Connect call. Text frames in,
``Session.handle``; the session's events out as JSON text frames, with ``stream_id`` added
for named lanes. Errors are the nested ``error`` event on the socket.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from bidi_responses.server.core.api.errors import ApiError
from bidi_responses.server.core.lanes.session import Session
from bidi_responses.server.core.runs.record import error_event
from bidi_responses.server.core.service import ResponsesCore
from bidi_responses.server.core.tenancy.request_budget import WEBSOCKET_COPIES
from bidi_responses.server.transports.admission import Caller, shutting_down
from bidi_responses.server.transports.http.errors import (
    auth_headers,
    error_response,
    invalid_json,
    too_large,
)
from bidi_responses.server.transports.http.framing import ws_batch_frame, ws_frame
from bidi_responses.server.transports.http.reading import caller, peer_of
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

# Close codes. 1000 ends WebSocket mode at its age limit as the hosted API does (the SDK then
# ends iteration quietly); 1012 "service restart" tells clients a shutdown dropped them, and is
# one of the codes the SDK reconnects after.
WS_CLOSE_NORMAL = 1000
WS_CLOSE_RESTART = 1012
# A client that stopped reading (write timeout): "policy violation", with a reason.
WS_CLOSE_POLICY = 1008


class _Connection:
    """One WebSocket-mode connection: its socket, its core session and how it will close."""

    def __init__(self, websocket: WebSocket, session: Session, who: Caller) -> None:
        self.websocket = websocket
        self.session = session
        self.caller = who
        self.close_code = WS_CLOSE_NORMAL
        self.close_reason = "connection age limit reached"
        # Non-standard batched frames (``?batch_frames=1``), for benchmark comparisons only.
        self.batch_frames = websocket.query_params.get("batch_frames") == "1"
        self.closed = asyncio.get_running_loop().create_future()


class WebSocketMode:
    """The WebSocket-mode endpoint; keeps only the set of open connections, for the drain."""

    def __init__(self, core: ResponsesCore) -> None:
        self._core = core
        self._connections: set[_Connection] = set()

    def route(self) -> WebSocketRoute:
        """The route, at the same path as ``POST /v1/responses``."""
        return WebSocketRoute("/v1/responses", self.serve)

    async def serve(self, websocket: WebSocket) -> None:
        """One WebSocket-mode connection = one core session, like one gRPC Connect call."""
        # Handshake headers (OpenAI-Beta, X-Stainless-*, Codex's own) are accepted and
        # otherwise ignored; no subprotocol is negotiated. Authorization is checked before the
        # upgrade, so a bad key gets a plain 401 (the SDK raises InvalidStatus).
        core = self._core
        try:
            who = caller(core, websocket.headers, peer_of(websocket))
            if core.draining:
                raise shutting_down("requests")
            session = core.open_session("websocket", caller=who)
        except ApiError as error:
            core.metrics.error("websocket", error.status, error.code)
            await websocket.send_denial_response(error_response(error, auth_headers(error)))
            return
        try:
            await websocket.accept()
        except BaseException:
            await core.close_session(session)
            raise
        conn = _Connection(websocket, session, who)
        self._connections.add(conn)
        session.start_age_limit()
        loop = asyncio.get_running_loop()
        reader = loop.create_task(self._read(conn), name="ws-reader")
        writer = loop.create_task(self._write(conn), name="ws-writer")
        try:
            # The reader ends when the client goes; the writer when the session ends (age
            # limit, drain) or a send fails. Either way the connection is over.
            await asyncio.wait((reader, writer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reader, writer):
                task.cancel()
            await asyncio.gather(reader, writer, return_exceptions=True)
            self._connections.discard(conn)
            await core.close_session(session)
            if not conn.closed.done():
                conn.closed.set_result(None)

    def _parse(self, text: str | None) -> Any:
        """A text frame's JSON; ApiError for a binary frame, one too large, or bad JSON."""
        limit = self._core.config.limits.max_message_bytes
        if text is None:
            raise ApiError(
                "Binary frames are not supported: send each event as a JSON text frame.",
                code="invalid_frame",
            )
        # Characters never outnumber UTF-8 bytes, so only long frames need encoding.
        if len(text) * 4 > limit and len(text.encode()) > limit:
            raise too_large(limit)
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise invalid_json(str(exc)) from None

    async def _read(self, conn: _Connection) -> None:
        session = conn.session
        websocket = conn.websocket
        while True:
            message = await websocket.receive()
            received = time.perf_counter()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            # The text, its parsed form and what the protocol still holds.
            size = WEBSOCKET_COPIES * (
                len(text) if isinstance(text, str) else len(message.get("bytes") or b"")
            )
            del text
            try:
                # Charged to the server-wide budget until the session has taken the event.
                self._core.request_bytes.take(size)
            except ApiError as problem:
                del message
                await session.emit("", error_event(problem.status, problem.to_error_object()))
                continue
            try:
                event = self._parse(message.get("text"))
            except ApiError as problem:
                self._core.request_bytes.release(size)
                # Through the session's queue, so it is ordered with everything else sent.
                await session.emit("", error_event(problem.status, problem.to_error_object()))
                del message
                continue
            if isinstance(event, dict) and event.get("type") == "response.create":
                # The socket always streams; clients (Codex, the SDK examples) still send it.
                event.pop("stream", None)
            try:
                await session.handle(event, received)
            finally:
                self._core.request_bytes.release(size)
            # An idle connection must not keep its last frame (it may be megabytes of input
            # that the cache budget does not see) alive in this frame.
            del message, event

    async def _write(self, conn: _Connection) -> None:
        websocket = conn.websocket
        write_timeout = self._core.config.limits.write_timeout_s
        frames: AsyncIterator[str]
        if conn.batch_frames:
            limit = self._core.config.streaming.max_batch_events
            frames = (ws_batch_frame(ready) async for ready in conn.session.event_batches(limit))
        else:
            frames = (ws_frame(out) async for out in conn.session.events())
        async for frame in frames:
            # A send waits while the socket's write buffer is full: a client that stopped
            # reading is cut off after the write timeout instead of held forever.
            try:
                async with asyncio.timeout(write_timeout):
                    await websocket.send_text(frame)
            except TimeoutError:
                self._core.counters.write_timeouts += 1
                await self._core.close_session(conn.session)  # cancels in-flight engine work
                await websocket.close(
                    WS_CLOSE_POLICY, f"write timeout: nothing read for {write_timeout:g} s"
                )
                return
        # The session ended from the server side: the age limit (its error event was the last
        # frame) or a drain at shutdown.
        await websocket.close(conn.close_code, conn.close_reason)

    async def drain(self, grace: float) -> None:
        """Let each connection's in-flight turns finish (within ``grace``), then close it.

        ``RunningServer.stop`` drains every core session (``core.drain_streams``); called on
        its own, this finishes the WebSocket sessions itself.
        """
        connections = list(self._connections)
        for conn in connections:
            # However the session ends from here on, the client learns it was a shutdown.
            conn.close_code = WS_CLOSE_RESTART
            conn.close_reason = "server shutting down"
        if grace <= 0 or not connections:
            return
        finishing = []
        if not self._core.draining:
            finishing = [asyncio.ensure_future(c.session.finish()) for c in connections]
        await asyncio.wait([conn.closed for conn in connections], timeout=grace)
        for task in finishing:
            task.cancel()
        await asyncio.gather(*finishing, return_exceptions=True)
