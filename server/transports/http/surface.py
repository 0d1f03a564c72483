"""HTTP routes beside create: compact, input token counts, models, and background mode.

Each route maps one-to-one onto a core call; the core owns the rules.
"""

from __future__ import annotations

from bidi_responses.schema import JSONObject, snapshot_of
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ...core import TransportPort
from ...core.api import ApiError
from ..admission import Caller
from ..errors import error_from_event
from .errors import json_response
from .reading import caller, peer_of, query_int, read_json
from .sse import event_log_response


def surface_routes(core: TransportPort) -> list[BaseRoute]:
    """The routes, to be listed before ``/v1/responses/{response_id}``."""

    async def compact(request: Request) -> Response:
        """``POST /v1/responses/compact`` (accounted to the caller's tenant, as creates)."""
        who = caller(core, request.headers, peer_of(request))
        body = await read_json(core, request)
        return json_response(await core.one_shot.compact(body, core.naming.one_shot, who))

    async def input_tokens(request: Request) -> Response:
        """``POST /v1/responses/input_tokens``."""
        tenant = caller(core, request.headers).tenant
        body = await read_json(core, request)
        return json_response(await core.one_shot.count_input_tokens(body, tenant))

    async def models(request: Request) -> Response:
        """``GET /v1/models``."""
        caller(core, request.headers)
        return json_response(core.one_shot.list_models())

    async def model(request: Request) -> Response:
        """``GET /v1/models/{model}`` (model ids may contain ``/``)."""
        caller(core, request.headers)
        return json_response(core.one_shot.get_model(request.path_params["model"]))

    return [
        Route("/v1/responses/compact", compact, methods=["POST"]),
        Route("/v1/responses/input_tokens", input_tokens, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
    ]


async def background_create(core: TransportPort, body: JSONObject, who: Caller) -> Response:
    """``POST /v1/responses`` with ``background: true``: answer at once; the response runs on.

    Without ``stream`` the body is the queued response; with it, its events as SSE, and a
    disconnect leaves the response running (resume with ``starting_after``).
    """
    first = await core.one_shot.start_background(body, core.naming.one_shot, who)
    if first["type"] == "error":
        raise error_from_event(first)
    response = snapshot_of(first)
    assert response is not None  # a background response begins with response.created
    if body.get("stream") is not True:
        return json_response(response)
    return event_log_response(core.one_shot.background_events(response["id"], -1, who.tenant))


def background_stream(core: TransportPort, request: Request, tenant: str | None) -> Response:
    """``GET /v1/responses/{id}?stream=true&starting_after=N``: replay, then follow live."""
    starting_after = query_int(request, "starting_after", -1)
    if starting_after < -1:
        raise ApiError("Invalid 'starting_after': expected >= 0.", param="starting_after")
    # ``events`` raises at once for an unknown id or events no longer kept.
    events = core.one_shot.background_events(
        request.path_params["response_id"], starting_after, tenant
    )
    return event_log_response(events)
