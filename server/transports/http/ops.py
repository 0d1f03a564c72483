"""Operational routes: health and readiness probes, the core's counters, Prometheus metrics."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ...core.observability.metrics import CONTENT_TYPE_LATEST
from ...core.service import ResponsesCore
from .errors import json_response
from .reading import caller


def ops_routes(core: ResponsesCore) -> list[BaseRoute]:
    """``/v1/stats``, ``/healthz``, ``/readyz`` and, if configured, the metrics path."""

    async def stats(request: Request) -> Response:
        """``GET /v1/stats``: the core's cumulative counters."""
        caller(core, request.headers)
        return json_response(core.stats())

    async def ready(request: Request) -> Response:
        """``GET /healthz`` and ``GET /readyz``: 503 once the server is draining, so load
        balancers stop sending (same meaning as grpc.health.v1's "" service)."""
        # Liveness needs no probe of its own here: a process that answers HTTP is alive, and
        # both probes flip together when draining starts.
        if core.draining:
            return json_response({"status": "shutting_down"}, 503)
        return json_response({"status": "ok"})

    async def metrics(request: Request) -> Response:
        """Prometheus text exposition."""
        return Response(core.metrics.scrape(), media_type=CONTENT_TYPE_LATEST)

    routes: list[BaseRoute] = [
        Route("/v1/stats", stats, methods=["GET"]),
        Route("/healthz", ready, methods=["GET"]),
        Route("/readyz", ready, methods=["GET"]),
    ]
    if core.config.metrics_path:
        routes.append(Route(core.config.metrics_path, metrics, methods=["GET"]))
    return routes
