"""HTTP+SSE and WebSocket mode on the core: Starlette routes served by uvicorn.

The same event pipeline as gRPC, in two more framings:

* ``POST /v1/responses`` runs one stateless create (``ResponsesCore.stateless``). With
  ``"stream": true`` each event is one SSE frame ``event: <type>\\ndata: <json>\\n\\n``, written
  in one piece; otherwise the terminal event's response object is the JSON body. A
  continuation resolves ``previous_response_id`` from the durable store.
* ``GET /v1/responses`` with ``Upgrade: websocket`` is WebSocket mode: one ``Session`` per
  connection, exactly like one gRPC Connect call. Text frames in, ``Session.handle``; the
  session's events out as JSON text frames, with ``stream_id`` added for named lanes.
* The stored-response routes, cancel, stats and a health check map one-to-one onto core calls.

Nothing here holds API state: caches, lanes, limits and error rules live in the core, so the
three transports answer the same request sequence the same way. Errors use OpenAI's JSON
error shape over HTTP and the nested ``error`` event on the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Mapping,
)
from typing import Any, cast

import orjson
import uvicorn
from bidi_responses.server.core.errors import ApiError
from bidi_responses.server.core.events import TERMINAL_TYPES, OutEvent, error_event
from bidi_responses.server.core.metrics import CONTENT_TYPE_LATEST
from bidi_responses.server.core.service import ResponsesCore
from bidi_responses.server.core.session import Session
from bidi_responses.server.core.tenants import tenant_from_authorization
from bidi_responses.server.tracing import wrap_asgi
from bidi_responses.server.transports.http_surface import (
    background_create,
    background_stream,
    surface_routes,
)
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

__all__ = [
    "HttpTransport",
    "error_body",
    "sse_frame",
    "start_http_server",
    "tenant_from_authorization",
    "ws_batch_frame",
    "ws_frame",
]

# Close codes. 1000 ends WebSocket mode at its age limit as the hosted API does (the SDK then
# ends iteration quietly); 1012 "service restart" tells clients a shutdown dropped them, and is
# one of the codes the SDK reconnects after.
WS_CLOSE_NORMAL = 1000
WS_CLOSE_RESTART = 1012
# A client that stopped reading (write timeout): "policy violation", with a reason.
WS_CLOSE_POLICY = 1008

# After closing a stalled client, how long the close frame may wait for it before the socket
# is dropped.
_STALLED_CLOSE_S = 10.0

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


# -- framing ---------------------------------------------------------------------------------


def sse_frame(data: Mapping[str, Any]) -> bytes:
    """One SSE event: ``event:`` line, one ``data:`` line, blank line; ``\\n`` endings only.

    orjson never emits a raw newline (it escapes them inside strings), so the JSON always fits
    on the single ``data:`` line strict parsers require.
    """
    return b"event: " + str(data["type"]).encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _ws_event(out: OutEvent) -> dict[str, Any]:
    return out.data if not out.lane else {**out.data, "stream_id": out.lane}


def ws_frame(out: OutEvent) -> str:
    """One WebSocket text frame for a session event; named lanes echo their ``stream_id``."""
    # Text, never binary: a binary frame is fatal to some clients (Codex).
    return orjson.dumps(_ws_event(out)).decode()


def ws_batch_frame(ready: list[OutEvent]) -> str:
    """Non-standard: the events ready together as one text frame holding a JSON array.

    Only for connections that asked with ``?batch_frames=1`` (a benchmark reference: what
    batching would give WebSocket mode if its wire allowed it; no hosted-API client parses it).
    """
    if len(ready) == 1:
        return ws_frame(ready[0])
    return orjson.dumps([_ws_event(out) for out in ready]).decode()


def error_body(error: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI's HTTP error body from an error object (``{"error": {message, type, ...}}``)."""
    return {
        "error": {
            "message": error.get("message", ""),
            "type": error.get("type", "invalid_request_error"),
            "param": error.get("param"),
            "code": error.get("code"),
        }
    }


def _json(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(data), status_code=status, headers=headers, media_type="application/json"
    )


def _error_response(error: ApiError, headers: Mapping[str, str] | None = None) -> Response:
    return _json(error_body(error.to_error_object()), error.status, headers)


def _event_error_response(
    event: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> Response:
    """An ``error`` event from the core as an HTTP error response (a rate limit adds
    ``retry-after``, which the openai SDKs wait for before retrying)."""
    status = event.get("status")
    error = event.get("error") or {}
    retry_after = error.get("retry_after_s")
    if retry_after:
        headers = {**(headers or {}), "retry-after": str(retry_after)}
    return _json(
        error_body(error),
        status if isinstance(status, int) and status >= 400 else 400,
        headers,
    )


def _shutting_down() -> ApiError:
    return ApiError(
        "The server is shutting down and takes no new requests; retry on another replica.",
        code="server_shutting_down",
        status=503,
        type="server_error",
    )


def _flat_sse_error(event: Mapping[str, Any], sequence_number: int) -> dict[str, Any]:
    """The core's nested error event in the flat shape SSE clients parse.

    The SDK raises mid-stream on any SSE data with a top-level ``error`` object, so SSE uses
    ``ResponseErrorEvent``: ``{"type": "error", "code", "message", "param", ...}``.
    """
    error = event.get("error") or {}
    return {
        "type": "error",
        "code": error.get("code"),
        "message": error.get("message", ""),
        "param": error.get("param"),
        "sequence_number": sequence_number,
    }


def _too_large(limit: int) -> ApiError:
    return ApiError(
        f"The message is larger than the limit of {limit} bytes.",
        code="request_too_large",
        status=413,
    )


def _invalid_json(detail: str) -> ApiError:
    return ApiError(
        f"We could not parse the JSON body of your request ({detail}). The API expects a JSON "
        "object.",
        code="invalid_json",
    )


# -- the WebSocket connection ----------------------------------------------------------------


class _Connection:
    """One WebSocket-mode connection: its socket, its core session and how it will close."""

    def __init__(self, websocket: WebSocket, session: Session, tenant: str | None) -> None:
        self.websocket = websocket
        self.session = session
        self.tenant = tenant
        self.close_code = WS_CLOSE_NORMAL
        self.close_reason = "connection age limit reached"
        # Non-standard batched frames (``?batch_frames=1``), for benchmark comparisons only.
        self.batch_frames = websocket.query_params.get("batch_frames") == "1"
        self.closed = asyncio.get_running_loop().create_future()


class HttpTransport:
    """The Starlette application over a core; keeps only the set of open WebSocket connections.

    ``drain`` lets in-flight WebSocket turns finish before the server stops accepting work.
    """

    def __init__(self, core: ResponsesCore) -> None:
        self._core = core
        self._connections: set[_Connection] = set()
        routes: list[BaseRoute] = [
            Route("/v1/responses", self.responses, methods=["GET", "POST"]),
            WebSocketRoute("/v1/responses", self.websocket_mode),
            *surface_routes(core, self._read_json, self._caller),
            Route("/v1/responses/{response_id}", self.retrieve, methods=["GET"]),
            Route("/v1/responses/{response_id}", self.delete, methods=["DELETE"]),
            Route("/v1/responses/{response_id}/input_items", self.input_items, methods=["GET"]),
            Route("/v1/responses/{response_id}/cancel", self.cancel, methods=["POST"]),
            Route("/v1/stats", self.stats, methods=["GET"]),
            Route("/healthz", self.health, methods=["GET"]),
            Route("/readyz", self.ready, methods=["GET"]),
        ]
        if core.config.metrics_path:
            routes.append(Route(core.config.metrics_path, self.metrics, methods=["GET"]))
        self.app = Starlette(
            routes=routes,
            exception_handlers={
                ApiError: self._api_error,
                HTTPException: self._http_error,
                Exception: self._server_error,
            },
        )

    # -- errors ------------------------------------------------------------------------------

    async def _api_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        self._core.metrics.error("http", exc.status, exc.code)
        headers = {"www-authenticate": "Bearer"} if exc.status == 401 else None
        return _error_response(exc, headers)

    def _caller(self, headers: Mapping[str, str]) -> tuple[str | None, str | None]:
        """(tenant, quota key) from ``Authorization``; ApiError 401 when keys are on and it is
        missing or wrong. The key is never logged or echoed."""
        authorization = headers.get("authorization")
        keys = self._core.keys
        tenant = keys.authenticate(authorization)
        return tenant, tenant or keys.label(authorization)

    @staticmethod
    async def _http_error(request: Request, exc: Exception) -> Response:
        # Routing misses (404, 405) in the same JSON shape as every other error.
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
        error = ApiError(
            f"{exc.detail}: {request.method} {request.url.path}", code=code, status=exc.status_code
        )
        return _error_response(error, exc.headers)

    @staticmethod
    async def _server_error(request: Request, exc: Exception) -> Response:
        error = ApiError(
            "The server had an error processing your request.",
            code="server_error",
            status=500,
            type="server_error",
        )
        return _error_response(error)

    # -- POST /v1/responses ------------------------------------------------------------------

    async def _read_json(self, request: Request) -> Any:
        """The request body as JSON, refusing bodies over the configured message limit."""
        limit = self._core.config.limits.max_message_bytes
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise _too_large(limit)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
        try:
            return orjson.loads(b"".join(chunks))
        except orjson.JSONDecodeError as exc:
            raise _invalid_json(str(exc)) from None

    async def responses(self, request: Request) -> Response:
        """``/v1/responses`` over plain HTTP: POST creates; GET without an upgrade is a 426."""
        if request.method == "POST":
            return await self.create(request)
        return await self.upgrade_required(request)

    async def create(self, request: Request) -> Response:
        """Create a response: SSE when the body says ``"stream": true``, else one JSON object."""
        tenant, quota = self._caller(request.headers)
        if self._core.draining:
            raise _shutting_down()
        body = await self._read_json(request)
        if not isinstance(body, dict):
            raise ApiError("The request body must be a JSON object.", code="invalid_type")
        if tenant is None and quota is not None and body.get("user") is None:
            body["user"] = quota  # open server: the token's label stands in for a tenant
        if body.get("background") is True:
            return await background_create(self._core, body, tenant, quota)
        # Only the body decides: the SDK sends Accept: application/json even when streaming.
        streaming = body.get("stream") is True
        # stateless() is an async generator; closing it early closes its session at once.
        events = cast(
            AsyncGenerator[dict[str, Any], None],
            self._core.stateless(body, "http", tenant, quota),
        )
        limiter = self._core.limiter
        quota_key = quota or "anonymous"
        if not streaming:
            async with contextlib.aclosing(events):
                async for data in events:
                    kind = data["type"]
                    if kind == "error":
                        return _event_error_response(data, limiter.headers(quota_key))
                    if kind in TERMINAL_TYPES:
                        return _json(data["response"], headers=limiter.headers(quota_key))
            raise ApiError(
                "The response ended without a terminal event.",
                code="server_error",
                status=500,
                type="server_error",
            )
        # Validation happens before response.created, so a bad request is still a plain 4xx
        # (the SDK raises on it) rather than a stream holding one error event.
        first = await anext(events, None)
        if first is None or first["type"] == "error":
            await events.aclose()
            if first is None:
                raise ApiError(
                    "The response ended before it started.",
                    code="server_error",
                    status=500,
                    type="server_error",
                )
            return _event_error_response(first, limiter.headers(quota_key))
        return _SseResponse(
            _sse_stream(first, events),
            self._core,
            media_type="text/event-stream",
            headers={**SSE_HEADERS, **limiter.headers(quota_key)},
        )

    async def upgrade_required(self, request: Request) -> Response:
        """``GET /v1/responses`` without an upgrade: WebSocket mode lives here."""
        error = ApiError(
            "GET /v1/responses is WebSocket mode: send 'Upgrade: websocket'.",
            code="upgrade_required",
            status=426,
        )
        return _error_response(error, {"upgrade": "websocket", "connection": "Upgrade"})

    # -- stored responses --------------------------------------------------------------------

    async def retrieve(self, request: Request) -> Response:
        """``GET /v1/responses/{id}``."""
        tenant, _ = self._caller(request.headers)
        if request.query_params.get("stream", "").lower() in ("true", "1"):
            # Replaying a stream is a background-mode feature: a response that did not run in
            # the background gets a clear error rather than JSON a client would not expect.
            response_id = request.path_params["response_id"]
            if not self._core.background.is_background(response_id, tenant):
                raise ApiError(
                    f"Response '{response_id}' can be streamed again only if it was created "
                    "with 'background': true (and its events are still kept).",
                    code="unsupported_parameter",
                    param="stream",
                )
            return background_stream(self._core, request, tenant)
        return _json(await self._core.get_response(request.path_params["response_id"], tenant))

    async def delete(self, request: Request) -> Response:
        """``DELETE /v1/responses/{id}``."""
        tenant, _ = self._caller(request.headers)
        return _json(await self._core.delete_response(request.path_params["response_id"], tenant))

    async def input_items(self, request: Request) -> Response:
        """``GET /v1/responses/{id}/input_items`` with ``limit``, ``order`` and ``after``."""
        tenant, _ = self._caller(request.headers)
        query = request.query_params
        raw_limit = query.get("limit")
        try:
            limit = 20 if raw_limit in (None, "") else int(raw_limit)
        except ValueError:
            raise ApiError(
                "Invalid 'limit': expected an integer.", code="invalid_type", param="limit"
            ) from None
        page = await self._core.list_input_items(
            request.path_params["response_id"],
            limit=limit,
            order=query.get("order") or "desc",
            after=query.get("after") or None,
            tenant=tenant,
        )
        return _json(page)

    async def cancel(self, request: Request) -> Response:
        """``POST /v1/responses/{id}/cancel``: stop an in-flight response from any transport."""
        tenant, _ = self._caller(request.headers)
        return _json(await self._core.cancel_response(request.path_params["response_id"], tenant))

    async def stats(self, request: Request) -> Response:
        """``GET /v1/stats``: the core's cumulative counters."""
        self._caller(request.headers)
        return _json(self._core.stats())

    async def health(self, request: Request) -> Response:
        """``GET /healthz``: SERVING until shutdown begins, like grpc.health.v1's "" service."""
        return self.ready_response()

    async def ready(self, request: Request) -> Response:
        """``GET /readyz``: 503 once the server is draining, so load balancers stop sending."""
        return self.ready_response()

    def ready_response(self) -> Response:
        # Liveness needs no probe of its own here: a process that answers HTTP is alive, and
        # both probes flip together when draining starts (same meaning as gRPC health).
        if self._core.draining:
            return _json({"status": "shutting_down"}, 503)
        return _json({"status": "ok"})

    async def metrics(self, request: Request) -> Response:
        """Prometheus text exposition."""
        return Response(self._core.metrics.scrape(), media_type=CONTENT_TYPE_LATEST)

    # -- WebSocket mode ----------------------------------------------------------------------

    async def websocket_mode(self, websocket: WebSocket) -> None:
        """One WebSocket-mode connection = one core session, like one gRPC Connect call."""
        # Handshake headers (OpenAI-Beta, X-Stainless-*, Codex's own) are accepted and
        # otherwise ignored; no subprotocol is negotiated. Authorization is checked before the
        # upgrade, so a bad key gets a plain 401 (the SDK raises InvalidStatus).
        core = self._core
        try:
            tenant, quota = self._caller(websocket.headers)
            if core.draining:
                raise _shutting_down()
            session = core.open_session("websocket", tenant=tenant, quota_key=quota)
        except ApiError as error:
            core.metrics.error("websocket", error.status, error.code)
            headers = {"www-authenticate": "Bearer"} if error.status == 401 else None
            await websocket.send_denial_response(_error_response(error, headers))
            return
        try:
            await websocket.accept()
        except BaseException:
            await core.close_session(session)
            raise
        conn = _Connection(websocket, session, quota if tenant is None else None)
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

    async def _read(self, conn: _Connection) -> None:
        session = conn.session
        websocket = conn.websocket
        limit = self._core.config.limits.max_message_bytes
        while True:
            message = await websocket.receive()
            received = time.perf_counter()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            problem: ApiError | None = None
            event: Any = None
            if text is None:
                problem = ApiError(
                    "Binary frames are not supported: send each event as a JSON text frame.",
                    code="invalid_frame",
                )
            # Characters never outnumber UTF-8 bytes, so only long frames need encoding.
            elif len(text) * 4 > limit and len(text.encode()) > limit:
                problem = _too_large(limit)
            else:
                try:
                    event = orjson.loads(text)
                except orjson.JSONDecodeError as exc:
                    problem = _invalid_json(str(exc))
            if problem is not None:
                # Through the session's queue, so it is ordered with everything else sent.
                await session.emit("", error_event(problem.status, problem.to_error_object()))
                del message, text
                continue
            if isinstance(event, dict) and event.get("type") == "response.create":
                # The socket always streams; clients (Codex, the SDK examples) still send it.
                event.pop("stream", None)
                if conn.tenant is not None and event.get("user") is None:
                    event["user"] = conn.tenant
            await session.handle(event, received)
            # An idle connection must not keep its last frame (it may be megabytes of input
            # that the cache budget does not see) alive in this frame.
            del message, text, event

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


class _SseResponse(StreamingResponse):
    """An SSE response whose writes give up after the write timeout: a client that stopped
    reading loses its connection, and its response is cancelled (the event iterator closes)."""

    def __init__(self, content: AsyncIterator[bytes], core: ResponsesCore, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._core = core

    async def stream_response(self, send: Any) -> None:
        """Stream the events; stop (the connection drops) at a write that times out."""
        write_timeout = self._core.config.limits.write_timeout_s

        async def timed_send(message: Any) -> None:
            async with asyncio.timeout(write_timeout):
                await send(message)

        try:
            await super().stream_response(timed_send)
        except TimeoutError:
            self._core.counters.write_timeouts += 1
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()


async def _sse_stream(
    first: dict[str, Any], events: AsyncGenerator[dict[str, Any], None]
) -> AsyncIterator[bytes]:
    """SSE frames of one response; the core's iterator stops after the terminal event.

    No ``data: [DONE]`` follows: OpenAI omits it and the SDK does not need it.
    """
    async with contextlib.aclosing(events):
        yield sse_frame(first)
        last = first.get("sequence_number", 0)
        async for data in events:
            if data["type"] == "error":
                data = _flat_sse_error(data, last + 1)
            last = data.get("sequence_number", last)
            yield sse_frame(data)


# -- the server ------------------------------------------------------------------------------


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside our process: the application, not uvicorn, owns SIGINT and SIGTERM."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._exit = asyncio.Event()

    def request_exit(self) -> None:
        """Begin the graceful shutdown now."""
        self.should_exit = True
        self._exit.set()

    async def main_loop(self) -> None:
        """uvicorn's loop, woken by ``request_exit`` instead of polling every 0.1 s."""
        counter = 0
        # on_tick refreshes the Date header when counter % 10 == 0, i.e. once per second here.
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864_000
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._exit.wait()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """Install no signal handlers (``app.serve`` has its own graceful stop)."""
        yield


class _WebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, except that closing never waits for a client that
    stopped reading: the close frame joins the buffered data, and the socket is dropped if
    the client still reads nothing for a while."""

    async def send(self, message: Any) -> None:
        """Send an ASGI message; a close goes out at once even while writing is paused."""
        if (
            message["type"] == "websocket.close"
            and self.handshake_complete
            and not self.writable.is_set()
        ):
            self.writable.set()
            await super().send(message)
            self.loop.call_later(_STALLED_CLOSE_S, self.transport.abort)
            return
        await super().send(message)


class _DenialLogFilter(logging.Filter):
    """uvicorn's sans-io WebSocket protocol sends a denial response (our 401/429/503 before the
    upgrade) correctly but then logs "returned without completing handshake" as if the app
    had failed; drop that one false alarm."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "without completing handshake" not in record.getMessage()


_DENIAL_FILTER = _DenialLogFilter()


def _listen(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A listening socket, so the bound port is known before uvicorn starts serving.

    ``reuse_port`` (``SO_REUSEPORT``): every worker process binds its own socket to the same
    port and the kernel spreads new connections over them.
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        # Listening now queues early connections in the backlog until uvicorn accepts them.
        sock.listen(2048)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def start_http_server(
    core: ResponsesCore, host: str, port: int, *, reuse_port: bool = False
) -> tuple[Callable[[float], Awaitable[None]], int]:
    """Serve HTTP+SSE and WebSocket mode; returns an async ``stop(grace)`` and the bound port.

    ``port`` 0 picks a free port. ``stop`` lets in-flight work finish for up to ``grace``
    seconds, then cancels what is left.
    """
    transport = HttpTransport(core)
    limit = core.config.limits.max_message_bytes
    tls = core.config.tls
    config = uvicorn.Config(
        wrap_asgi(transport.app, core.config.tracing),
        ssl_certfile=tls.cert_file if tls.enabled else None,
        ssl_keyfile=tls.key_file if tls.enabled else None,
        ssl_ca_certs=tls.client_ca_file if tls.enabled else None,
        ssl_cert_reqs=ssl.CERT_REQUIRED if tls.enabled and tls.client_ca_file else ssl.CERT_NONE,
        lifespan="off",
        log_level="warning",
        log_config=None,
        access_log=False,
        http="auto",
        ws=_WebSocketProtocol,
        # Refused from the frame header (close 1009), before the payload is buffered.
        ws_max_size=limit,
        server_header=False,
    )
    config.load()
    uvicorn_log = logging.getLogger("uvicorn.error")
    if _DENIAL_FILTER not in uvicorn_log.filters:
        uvicorn_log.addFilter(_DENIAL_FILTER)
    sock = _listen(host, port, reuse_port=reuse_port)
    bound = int(sock.getsockname()[1])
    server = _EmbeddedServer(config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]), name="http-server")

    async def stop(grace: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        await transport.drain(grace)
        # SSE responses still running get what is left of the grace period. The floor lets
        # uvicorn see connections it has just closed go away, instead of reporting a timeout.
        # uvicorn annotates this as int but hands it to asyncio.wait_for, which takes seconds.
        config.timeout_graceful_shutdown = max(deadline - loop.time(), 0.05)  # type: ignore[assignment]
        server.request_exit()
        try:
            await task
        finally:
            sock.close()
            # uvicorn cancels handlers that outlive the grace period but does not wait for
            # them; wait here so their cleanup (closing sessions) runs before the core closes.
            await asyncio.gather(*list(server.server_state.tasks), return_exceptions=True)

    return stop, bound
