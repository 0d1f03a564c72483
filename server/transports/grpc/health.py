"""The standard gRPC health service (``grpc.health.v1.Health``), for proxies and probes.

Envoy's gRPC health checks (``docs/replicas.md``) and Kubernetes probes ask it whether this
replica takes new streams. It answers SERVING for the whole server (service ``""``) and for
``bidi_responses.v1.ResponsesService`` until a drain starts, then NOT_SERVING, so the proxy
stops sending new streams here while in-flight responses finish. Other names are NOT_FOUND.

The asyncio servicer, not the threaded one: a ``Watch`` stream of the threaded servicer blocks
a thread that a server stop cannot wake, so a watching client would hold shutdown forever.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

SERVICE_NAMES = ("", "bidi_responses.v1.ResponsesService")


class HealthService:
    """The servicer and the task that turns it NOT_SERVING."""

    def __init__(self, servicer: health.aio.HealthServicer) -> None:
        self.servicer = servicer
        self.draining: asyncio.Task[None] | None = None


async def add_health_service(server: grpc.aio.Server) -> HealthService:
    """Register the health service on ``server`` (before it starts), all SERVING."""
    servicer = health.aio.HealthServicer()
    for name in SERVICE_NAMES:
        await servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return HealthService(servicer)


def mark_draining(service: HealthService) -> None:
    """Answer NOT_SERVING from now on (a drain has started). Runs on the event loop's next
    turn, before the drain gives up control to anything that closes the listener."""
    if service.draining is None:
        service.draining = asyncio.get_running_loop().create_task(
            service.servicer.enter_graceful_shutdown(), name="health-not-serving"
        )
