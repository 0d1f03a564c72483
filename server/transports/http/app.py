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

from ...core.service import ResponsesCore
from .errors import exception_handlers
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

    def __init__(self, core: ResponsesCore) -> None:
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
                *ops_routes(core),
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
        self._handlers.add(task)
        try:
            await self.app(scope, receive, send)
        finally:
            self._handlers.discard(task)

    async def handlers_done(self) -> None:
        """Wait for the handlers still running (cancelled ones run their cleanup)."""
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def drain(self, grace: float) -> None:
        """Let WebSocket connections finish their in-flight turns (within ``grace``)."""
        await self.websockets.drain(grace)
