"""Building and starting the gRPC listener: channel options (limits, keepalive, connection
age), TLS, the API with grpc.health.v1 and server reflection beside it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from bidi_responses.codec.aio_wakeups import drain_completion_wakeups
from grpc_health.v1 import health

from ...config import ServerConfig, TlsConfig
from ...core import TransportPort
from ...tracing import grpc_interceptors
from ..connections import connection_caps
from .client_gone_log import quiet_client_gone_sends
from .connect import StreamsPerConnection
from .health import add_health_service, mark_draining
from .reflection import enable_reflection
from .registration import SERVICE, add_servicer
from .servicer import ResponsesServicer

SERVICE_NAME = SERVICE.full_name


def server_options(config: ServerConfig) -> list[tuple[str, Any]]:
    """Channel arguments of the listener: message limits, keepalive, connection age."""
    limit = config.limits.max_message_bytes
    ka = config.keepalive
    return [
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", limit),
        # Connections held at once: grpc core's connection quota closes one past it right
        # at accept(), so a flood cannot take the descriptors the other listener and the
        # store need (connections.py).
        ("grpc.max_allowed_incoming_connections", connection_caps(config.limits).grpc),
        # A connection that has not finished its HTTP/2 (and TLS) handshake in this time is
        # closed: gRPC's default, 120 s, let a flood of silent connections hold the share.
        ("grpc.server_handshake_timeout_ms", 20_000),
        # Off for one process, so a port already in use is an error at start-up; on when
        # worker processes share the port (the kernel spreads connections).
        ("grpc.so_reuseport", 1 if config.workers > 1 else 0),
        # Calls that arrived but that the server has not picked up yet. Past the soft limit
        # gRPC cancels the oldest (clients saw CANCELLED or INTERNAL in a burst of opens);
        # past the hard limit it refuses new ones with RESOURCE_EXHAUSTED.
        ("grpc.server.max_pending_requests", config.tenant_limits.max_pending_calls),
        (
            "grpc.server.max_pending_requests_hard_limit",
            config.tenant_limits.max_pending_calls_hard,
        ),
        # Accept client pings down to this interval, with or without calls in flight.
        ("grpc.http2.min_ping_interval_without_data_ms", int(ka.min_client_ping_interval_s * 1000)),
        ("grpc.keepalive_permit_without_calls", int(ka.permit_pings_without_calls)),
        ("grpc.http2.max_ping_strikes", ka.max_ping_strikes),
        # The server's own pings find dead peers behind idle NATs and load balancers.
        ("grpc.keepalive_time_ms", int(ka.server_ping_interval_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(ka.server_ping_timeout_s * 1000)),
        ("grpc.max_connection_age_ms", int(ka.max_connection_age_s * 1000)),
        ("grpc.max_connection_age_grace_ms", int(ka.max_connection_age_grace_s * 1000)),
    ]


def _credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    """TLS from PEM files; a client CA file makes client certificates mandatory (mTLS)."""
    assert tls.cert_file and tls.key_file
    key = Path(tls.key_file).read_bytes()
    cert = Path(tls.cert_file).read_bytes()
    ca = Path(tls.client_ca_file).read_bytes() if tls.client_ca_file else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )


@dataclass(slots=True)
class GrpcServer:
    """The started gRPC listener."""

    server: grpc.aio.Server
    port: int


async def start_grpc_server(
    core: TransportPort,
    config: ServerConfig,
    host: str,
    port: int,
    options: list[tuple[str, Any]] | None = None,
) -> GrpcServer:
    """Start the gRPC server over what the application hands it (``core``): the API,
    grpc.health.v1 and server reflection (``port`` 0 picks a free one)."""
    quiet_client_gone_sends()
    server = grpc.aio.server(
        options=server_options(config) + list(options or ()),
        interceptors=grpc_interceptors(config.tracing),
    )
    per_connection = StreamsPerConnection(
        config.tenant_limits.max_streams_per_connection, core.metrics
    )
    add_servicer(ResponsesServicer(core, per_connection), server)
    health_servicer = await add_health_service(server)
    # NOT_SERVING as soon as a drain begins, while the listener is still open.
    core.on_drain(lambda: mark_draining(health_servicer))
    enable_reflection((SERVICE_NAME, health.SERVICE_NAME), server)
    address = f"{host}:{port}"
    if config.tls.enabled:
        bound = server.add_secure_port(address, _credentials(config.tls))
    else:
        bound = server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {address}")
    await server.start()
    core.metrics.connection_limit.labels("grpc", "server").set(connection_caps(config.limits).grpc)
    # grpc.aio's completions reach the loop through wake-up bytes it reads one at a time; on
    # a busy server they pile up and stall every write (see codec/aio_wakeups.py).
    drain_completion_wakeups()
    return GrpcServer(server, bound)
