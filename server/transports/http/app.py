"""The Starlette application over a core: every route, the error handlers, and what the
server's lifecycle needs from the app (its lifespan, its running handlers).

Nothing here holds API state: caches, lanes, limits and error rules live in the core, so the
three transports answer the same request sequence the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from ...core import TransportPort
from ...core.api import ApiError
from ..connections import ConnectionAccount
from .errors import error_response, exception_handlers
from .ops import ops_routes
from .responses import responses_route, stored_response_routes
from .surface import surface_routes
from .websocket import WebSocketMode


class HttpTransport:
    """The application and its WebSocket-mode endpoint, whose connections ``drain`` lets
    finish their in-flight turns before the server stops accepting work.

    ``asgi`` is the ASGI entry point: the app, remembering the tasks that run its request
    and connection handlers so that a stop can wait for their cleanup.
    """

    def __init__(
        self,
        core: TransportPort,
        metrics_path: str,
        account: ConnectionAccount | None = None,
    ) -> None:
        self._core = core
        #: The listener's connections; a connection it refused is answered with the reason.
        self.account = account
        self.websockets = WebSocketMode(core)
        # Set by the app's lifespan: the server has started.
        self.started = asyncio.Event()
        self._handlers: set[asyncio.Task[object]] = set()
        self.app = Starlette(
            routes=[
                responses_route(core),
                self.websockets.route(),
                # Fixed paths under /v1/responses/ before /v1/responses/{response_id}.
                *surface_routes(core),
                *stored_response_routes(core),
                *ops_routes(core, metrics_path),
            ],
            exception_handlers=exception_handlers(core.metrics),
            lifespan=self._lifespan,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.started.set()
        yield

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI application."""
        task = asyncio.current_task()
        if scope["type"] == "lifespan" or task is None:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        if self.account is not None and client is not None:
            refusal = self.account.refusal(client[0], client[1])
            if refusal is not None:
                await self._refuse(refusal, scope, receive, send)
                return
        self._handlers.add(task)
        try:
            await self.app(scope, receive, send)
        finally:
            self._handlers.discard(task)

    async def _refuse(self, refusal: ApiError, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a connection past a connection limit with the reason, then close it (a
        WebSocket upgrade is denied with the same status and body)."""
        naming = self._core.naming
        transport = naming.stream.transport if scope["type"] == "websocket" else naming.one_shot
        self._core.metrics.error(transport, refusal.status, refusal.code)
        response = error_response(refusal, {"connection": "close", "retry-after": "1"})
        if scope["type"] == "websocket":
            await WebSocket(scope, receive, send).send_denial_response(response)
        else:
            await response(scope, receive, send)

    async def handlers_done(self) -> None:
        """Wait for the handlers still running (cancelled ones run their cleanup)."""
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def drain(self, grace: float) -> None:
        """Let WebSocket connections finish their in-flight turns (within ``grace``)."""
        await self.websockets.drain(grace)
