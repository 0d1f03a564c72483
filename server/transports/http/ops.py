"""Operational routes: health and readiness probes, the core's counters, Prometheus metrics."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ...core import TransportPort
from ...core.observability import CONTENT_TYPE_LATEST
from .errors import json_response
from .reading import caller


def ops_routes(core: TransportPort, metrics_path: str) -> list[BaseRoute]:
    """``/v1/stats``, ``/healthz``, ``/readyz`` and, if configured, ``metrics_path``."""

    async def stats(request: Request) -> Response:
        """``GET /v1/stats``: the core's cumulative counters."""
        caller(core, request.headers)
        return json_response(core.one_shot.stats())

    async def ready(request: Request) -> Response:
        """``GET /healthz`` and ``GET /readyz``: 503 once the server is draining, so load
        balancers stop sending (same meaning as grpc.health.v1's "" service)."""
        # Liveness needs no probe of its own here: a process that answers HTTP is alive, and
        # both probes flip together when draining starts.
        if core.one_shot.draining:
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
    if metrics_path:
        routes.append(Route(metrics_path, metrics, methods=["GET"]))
    return routes
