"""WebSocket mode: ``GET /v1/responses`` with ``Upgrade: websocket``.

One core session per connection, run by the stream driver exactly like one gRPC Connect call;
this adapter (``WebSocketWire``) only translates framing: JSON text frames in, typed by the
core's JSON parser; the session's events out as JSON text frames, with ``stream_id`` added
for named lanes. Errors are the nested ``error`` event on the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import orjson
from starlette.routing import WebSocketRoute
from starlette.types import Message
from starlette.websockets import WebSocket

from ...core import StreamSession, TransportPort
from ...core.api import ApiError, EventRefused, parse_json_event
from ...core.runs import OutEvent, answers_to
from ..streams import (
    Incoming,
    Refusal,
    StreamDriver,
    open_stream,
)
from .errors import (
    auth_headers,
    error_response,
    invalid_json,
    too_large,
)
from .framing import ws_batch_frame, ws_frame
from .reading import caller, peer_of
from .uvicorn_ws import send_texts_of

# Close codes. 1000 ends WebSocket mode at its age limit as the hosted API does (the SDK then
# ends iteration quietly); 1012 "service restart" tells clients a shutdown dropped them, and is
# one of the codes the SDK reconnects after.
WS_CLOSE_NORMAL = 1000
WS_CLOSE_RESTART = 1012
# A client that stopped reading (write timeout): "policy violation", with a reason.
WS_CLOSE_POLICY = 1008


class WebSocketWire:
    """One WebSocket-mode connection as the stream driver's wire: JSON text frames in and
    out, and how it will close."""

    half_close = False  # a client's close ends the connection

    # Slots: every open connection keeps one of these for its whole life.
    __slots__ = (
        "_copies",
        "_limits",
        "_send_texts",
        "array_frames",
        "close_code",
        "close_reason",
        "closed",
        "session",
        "websocket",
    )

    def __init__(self, websocket: WebSocket, session: StreamSession, core: TransportPort) -> None:
        self.websocket = websocket
        self.session = session
        self._limits = core.limits
        self._copies = core.naming.stream_copies
        self.close_code = WS_CLOSE_NORMAL
        self.close_reason = "connection age limit reached"
        # Non-standard batched frames (``?batch_frames=1``), for benchmark comparisons only.
        self.array_frames = websocket.query_params.get("batch_frames") == "1"
        self._send_texts = send_texts_of(websocket.scope)
        self.closed = asyncio.get_running_loop().create_future()

    async def receive(self) -> Message | None:
        message = await self.websocket.receive()
        return None if message["type"] == "websocket.disconnect" else message

    def size(self, message: Message) -> int:
        # The text, its parsed form and what the protocol still holds.
        text = message.get("text")
        return self._copies * (
            len(text) if isinstance(text, str) else len(message.get("bytes") or b"")
        )

    def refused(self, message: Message, error: ApiError) -> Refusal:
        return Refusal("", error)

    def decode(self, message: Message) -> Incoming | Refusal | None:
        try:
            event = self._parse(message.get("text"))
        except ApiError as problem:
            return Refusal("", problem)
        if isinstance(event, dict) and event.get("type") == "response.create":
            # The socket always streams; clients (Codex, the SDK examples) still send it.
            event.pop("stream", None)
        try:
            return Incoming(parse_json_event(event, self._limits))
        except EventRefused as refused:
            return Refusal(refused.lane, refused.error, answers_to(event), refused.__cause__)

    def _parse(self, text: str | None) -> Any:
        """A text frame's JSON; ApiError for a binary frame, one too large, or bad JSON."""
        limit = self._limits.max_message_bytes
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

    def frames(self, ready: list[OutEvent]) -> Sequence[bytes]:
        if self.array_frames:
            return [ws_batch_frame(ready)]
        return [ws_frame(out) for out in ready]

    async def send(self, frames: Sequence[bytes]) -> None:
        await self._send_texts(frames)

    async def abort(self, error: ApiError) -> None:
        if error.code == "write_timeout":
            # A client that stopped reading: "policy violation", with a reason.
            timeout = self._limits.write_timeout_s
            await self._close(WS_CLOSE_POLICY, f"write timeout: nothing read for {timeout:g} s")
            return
        # The session ended from the server side: the age limit (its error event was the
        # last frame) or a drain at shutdown.
        await self.close()

    async def close(self) -> None:
        await self._close(self.close_code, self.close_reason)

    async def _close(self, code: int, reason: str) -> None:
        # The client may have gone meanwhile: then there is nobody left to tell.
        with contextlib.suppress(Exception):
            await self.websocket.close(code, reason)


class WebSocketMode:
    """The WebSocket-mode endpoint; keeps only the set of open connections, for the drain."""

    def __init__(self, core: TransportPort) -> None:
        self._core = core
        self._connections: set[WebSocketWire] = set()

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
            session = open_stream(core, who, refused="requests")
        except ApiError as error:
            core.metrics.error(core.naming.stream.transport, error.status, error.code)
            await websocket.send_denial_response(error_response(error, auth_headers(error)))
            return
        try:
            await websocket.accept()
        except BaseException:
            await core.streams.close_session(session)
            raise
        conn = WebSocketWire(websocket, session, core)
        self._connections.add(conn)
        try:
            # The reader ends when the client goes; the writer when the session ends (age
            # limit, drain) or a send fails. Either way the connection is over.
            await StreamDriver(core, session, conn).run()
        finally:
            self._connections.discard(conn)
            if not conn.closed.done():
                conn.closed.set_result(None)

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
        if not self._core.streams.draining:
            finishing = [asyncio.ensure_future(c.session.finish()) for c in connections]
        await asyncio.wait([conn.closed for conn in connections], timeout=grace)
        for task in finishing:
            task.cancel()
        await asyncio.gather(*finishing, return_exceptions=True)
