"""HTTP routes beside create: compact, input token counts, models, and background mode.

Each route maps one-to-one onto a core call; the core owns the rules. Kept apart from
``http_transport`` so the create path stays short.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import orjson
from bidi_responses.server.core.errors import ApiError
from bidi_responses.server.core.service import ResponsesCore
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

ReadJson = Callable[[Request], Awaitable[Any]]
# Request headers -> (tenant, quota key); raises the 401 when API keys are on.
Caller = Callable[[Mapping[str, str]], tuple[str | None, str | None]]


def _json(data: Any) -> Response:
    return Response(orjson.dumps(data), media_type="application/json")


def surface_routes(core: ResponsesCore, read_json: ReadJson, caller: Caller) -> list[BaseRoute]:
    """The routes, to be listed before ``/v1/responses/{response_id}``."""

    async def compact(request: Request) -> Response:
        """``POST /v1/responses/compact`` (accounted to the caller's tenant, as creates)."""
        tenant, quota = caller(request.headers)
        body = await read_json(request)
        if isinstance(body, dict) and tenant is None and quota and body.get("user") is None:
            body["user"] = quota  # open server: the token's label stands in for a tenant
        return _json(await core.compact(body, "http", tenant))

    async def input_tokens(request: Request) -> Response:
        """``POST /v1/responses/input_tokens``."""
        tenant, _ = caller(request.headers)
        return _json(await core.count_input_tokens(await read_json(request), tenant))

    async def models(request: Request) -> Response:
        """``GET /v1/models``."""
        caller(request.headers)
        return _json(core.list_models())

    async def model(request: Request) -> Response:
        """``GET /v1/models/{model}`` (model ids may contain ``/``)."""
        caller(request.headers)
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


async def background_create(
    core: ResponsesCore, body: dict[str, Any], tenant: str | None, quota: str | None
) -> Response:
    """``POST /v1/responses`` with ``background: true``: answer at once; the response runs on.

    Without ``stream`` the body is the queued response; with it, its events as SSE, and a
    disconnect leaves the response running (resume with ``starting_after``).
    """
    first = await core.background.start(body, "http", tenant, quota)
    if first["type"] == "error":
        raise _error_status(first)
    if body.get("stream") is not True:
        return _json(first["response"])
    return _stream(core, first["response"]["id"], -1, tenant)


def background_stream(core: ResponsesCore, request: Request, tenant: str | None) -> Response:
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
    return _stream(core, request.path_params["response_id"], starting_after, tenant)


def _stream(
    core: ResponsesCore, response_id: str, starting_after: int, tenant: str | None
) -> Response:
    # The transport's own framing (imported here: that module imports this one).
    from bidi_responses.server.transports.http_transport import SSE_HEADERS, sse_frame

    events = core.background.events(response_id, starting_after, tenant)  # raises first

    async def frames() -> AsyncIterator[bytes]:
        # Reading a log: a client going away cancels nothing.
        async for data in events:
            yield sse_frame(data)

    return StreamingResponse(frames(), media_type="text/event-stream", headers=SSE_HEADERS)
