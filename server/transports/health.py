"""The standard gRPC health service (``grpc.health.v1.Health``), for proxies and probes.

Envoy's gRPC health checks (``docs/replicas.md``) and Kubernetes probes ask it whether this
replica takes new streams. It answers SERVING for the whole server (service ``""``) and for
``bidi_responses.v1.ResponsesService`` until a drain starts, then NOT_SERVING, so the proxy
stops sending new streams here while in-flight responses finish.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

SERVICE_NAMES = ("", "bidi_responses.v1.ResponsesService")


def add_health_service(server: grpc.aio.Server) -> health.HealthServicer:
    """Register the health service on ``server`` (before it starts), all SERVING."""
    servicer = health.HealthServicer()
    for name in SERVICE_NAMES:
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return servicer


def mark_draining(servicer: health.HealthServicer) -> None:
    """Answer NOT_SERVING from now on (a drain has started)."""
    servicer.enter_graceful_shutdown()
