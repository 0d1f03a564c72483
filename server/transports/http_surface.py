"""HTTP routes beside create: compact, input token counts, models, and background mode.

Each route maps one-to-one onto a core call; the core owns the rules. Kept apart from
``http_transport`` so the create path stays short.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from bidi_responses.server.core.errors import ApiError
from bidi_responses.server.core.service import ResponsesCore
from bidi_responses.server.core.tenants import tenant_from_authorization
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

ReadJson = Callable[[Request], Awaitable[Any]]


def _json(data: Any) -> Response:
    return Response(orjson.dumps(data), media_type="application/json")


def surface_routes(core: ResponsesCore, read_json: ReadJson) -> list[BaseRoute]:
    """The routes, to be listed before ``/v1/responses/{response_id}``."""

    async def compact(request: Request) -> Response:
        """``POST /v1/responses/compact`` (accounted to the bearer key's tenant, as creates)."""
        body = await read_json(request)
        tenant = tenant_from_authorization(request.headers.get("authorization"))
        if isinstance(body, dict) and tenant is not None and body.get("user") is None:
            body["user"] = tenant
        return _json(await core.compact(body, "http"))

    async def input_tokens(request: Request) -> Response:
        """``POST /v1/responses/input_tokens``."""
        return _json(await core.count_input_tokens(await read_json(request)))

    async def models(request: Request) -> Response:
        """``GET /v1/models``."""
        return _json(core.list_models())

    async def model(request: Request) -> Response:
        """``GET /v1/models/{model}`` (model ids may contain ``/``)."""
        return _json(core.get_model(request.path_params["model"]))

    return [
        Route("/v1/responses/compact", compact, methods=["POST"]),
        Route("/v1/responses/input_tokens", input_tokens, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
    ]


def _error_status(event: dict[str, Any]) -> ApiError:
    error = event.get("error") or {}
    status = event.get("status")
    return ApiError(
        error.get("message", ""),
        code=error.get("code") or "invalid_value",
        param=error.get("param"),
        status=status if isinstance(status, int) and status >= 400 else 400,
        type=error.get("type") or "invalid_request_error",
    )


async def background_create(core: ResponsesCore, body: dict[str, Any]) -> Response:
    """``POST /v1/responses`` with ``background: true``: answer at once; the response runs on.

    Without ``stream`` the body is the queued response; with it, its events as SSE, and a
    disconnect leaves the response running (resume with ``starting_after``).
    """
    first = await core.background.start(body, "http")
    if first["type"] == "error":
        raise _error_status(first)
    if body.get("stream") is not True:
        return _json(first["response"])
    return _stream(core, first["response"]["id"], -1)


def background_stream(core: ResponsesCore, request: Request) -> Response:
    """``GET /v1/responses/{id}?stream=true&starting_after=N``: replay, then follow live."""
    raw = request.query_params.get("starting_after")
    try:
        starting_after = -1 if raw in (None, "") else int(raw)
    except ValueError:
        raise ApiError(
            "Invalid 'starting_after': expected an integer.",
            code="invalid_type",
            param="starting_after",
        ) from None
    if starting_after < -1:
        raise ApiError("Invalid 'starting_after': expected >= 0.", param="starting_after")
    return _stream(core, request.path_params["response_id"], starting_after)


def _stream(core: ResponsesCore, response_id: str, starting_after: int) -> Response:
    # The transport's own framing (imported here: that module imports this one).
    from bidi_responses.server.transports.http_transport import SSE_HEADERS, sse_frame

    events = core.background.events(response_id, starting_after)  # raises before streaming

    async def frames() -> AsyncIterator[bytes]:
        # Reading a log: a client going away cancels nothing.
        async for data in events:
            yield sse_frame(data)

    return StreamingResponse(frames(), media_type="text/event-stream", headers=SSE_HEADERS)
