"""``/v1/responses`` over plain HTTP: create (JSON or SSE) and the stored-response routes.

``POST /v1/responses`` runs one stateless create (``OneShotPort.respond``). With
``"stream": true`` each event is one SSE frame written in one piece; otherwise the terminal
event's response object is the JSON body. A continuation resolves ``previous_response_id``
from the durable store. Retrieve, delete, input items and cancel map one-to-one onto core
calls.
"""

from __future__ import annotations

import contextlib

from bidi_responses.schema import terminal_response
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ...core import TransportPort
from ...core.api import ApiError, shown
from ..admission import shutting_down
from .errors import (
    error_response,
    event_error_response,
    json_response,
)
from .reading import caller, peer_of, query_int, read_json
from .sse import SseResponse, sse_stream
from .surface import background_create, background_stream


def _ended_early(core: TransportPort, what: str) -> ApiError:
    """The error for a core event stream that ended without its terminal event: a 503 when a
    drain stopped it at the end of its grace period, else a 500."""
    if core.one_shot.draining:
        return shutting_down("requests")
    return ApiError(what, code="server_error", status=500, type="server_error")


async def create(core: TransportPort, request: Request) -> Response:
    """Create a response: SSE when the body says ``"stream": true``, else one JSON object."""
    who = caller(core, request.headers, peer_of(request))
    if core.one_shot.draining:
        raise shutting_down("requests")
    body = await read_json(core, request)
    if not isinstance(body, dict):
        raise ApiError("The request body must be a JSON object.", code="invalid_type")
    if body.get("background") is True:
        return await background_create(core, body, who)
    # Only the body decides: the SDK sends Accept: application/json even when streaming.
    streaming = body.get("stream") is True
    # respond() is an async generator; closing it early stops the response at once.
    events = core.one_shot.respond(body, core.naming.one_shot, who)

    def limit_headers() -> dict[str, str]:
        # Read once the request has been admitted: they count it.
        return core.one_shot.rate_limit_headers(who.quota_key)

    if not streaming:
        async with contextlib.aclosing(events):
            async for data in events:
                if data["type"] == "error":
                    return event_error_response(data, limit_headers())
                response = terminal_response(data)
                if response is not None:
                    return json_response(response, headers=limit_headers())
        raise _ended_early(core, "The response ended without a terminal event.")
    # Validation happens before response.created, so a bad request is still a plain 4xx
    # (the SDK raises on it) rather than a stream holding one error event.
    first = await anext(events, None)
    if first is None or first["type"] == "error":
        await events.aclose()
        if first is None:
            raise _ended_early(core, "The response ended before it started.")
        return event_error_response(first, limit_headers())
    return SseResponse(sse_stream(first, events), core, headers=limit_headers())


def responses_route(core: TransportPort) -> Route:
    """``/v1/responses`` over plain HTTP: POST creates; GET without an upgrade is a 426
    (WebSocket mode lives at the same path)."""

    async def responses(request: Request) -> Response:
        if request.method == "POST":
            return await create(core, request)
        error = ApiError(
            "GET /v1/responses is WebSocket mode: send 'Upgrade: websocket'.",
            code="upgrade_required",
            status=426,
        )
        return error_response(error, {"upgrade": "websocket", "connection": "Upgrade"})

    return Route("/v1/responses", responses, methods=["GET", "POST"])


def stored_response_routes(core: TransportPort) -> list[BaseRoute]:
    """The routes of one stored response, to be listed after the fixed paths under
    ``/v1/responses/``."""

    async def retrieve(request: Request) -> Response:
        """``GET /v1/responses/{id}``."""
        tenant = caller(core, request.headers).tenant
        response_id = request.path_params["response_id"]
        if request.query_params.get("stream", "").lower() in ("true", "1"):
            # Replaying a stream is a background-mode feature: a response that did not run in
            # the background gets a clear error rather than JSON a client would not expect.
            if not core.one_shot.is_background(response_id, tenant):
                raise ApiError(
                    f"Response '{shown(response_id)}' can be streamed again only if it was created "
                    "with 'background': true (and its events are still kept).",
                    code="unsupported_parameter",
                    param="stream",
                )
            return background_stream(core, request, tenant)
        return json_response(await core.one_shot.get_response(response_id, tenant))

    async def delete(request: Request) -> Response:
        """``DELETE /v1/responses/{id}``."""
        tenant = caller(core, request.headers).tenant
        return json_response(
            await core.one_shot.delete_response(request.path_params["response_id"], tenant)
        )

    async def input_items(request: Request) -> Response:
        """``GET /v1/responses/{id}/input_items`` with ``limit``, ``order`` and ``after``."""
        tenant = caller(core, request.headers).tenant
        query = request.query_params
        page = await core.one_shot.list_input_items(
            request.path_params["response_id"],
            limit=query_int(request, "limit", 20),
            order=query.get("order") or "desc",
            after=query.get("after") or None,
            tenant=tenant,
        )
        return json_response(page)

    async def cancel(request: Request) -> Response:
        """``POST /v1/responses/{id}/cancel``: stop an in-flight response from any transport."""
        tenant = caller(core, request.headers).tenant
        return json_response(
            await core.one_shot.cancel_response(request.path_params["response_id"], tenant)
        )

    return [
        Route("/v1/responses/{response_id}", retrieve, methods=["GET"]),
        Route("/v1/responses/{response_id}", delete, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/input_items", input_items, methods=["GET"]),
        Route("/v1/responses/{response_id}/cancel", cancel, methods=["POST"]),
    ]
