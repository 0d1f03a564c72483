"""The gRPC transport: ``ResponsesService`` on grpc.aio.

The servicer only converts between protobuf and the core's dicts; sessions, caches and rules
live in the core. A Connect call is one Session (``connect.py``); ``CreateResponse`` is one
stateless create (``create.py``); the other calls are one core call each (``servicer.py``).
Requests are decoded in the handlers and every error becomes a chosen status
(``registration.py``, ``status.py``); the listener, health, reflection, TLS and keepalive are
set up in ``server.py`` and ``health.py``.
"""

from bidi_responses.server.transports.grpc.connect import StreamsPerConnection
from bidi_responses.server.transports.grpc.delivery import Delivery
from bidi_responses.server.transports.grpc.server import (
    SERVICE_NAME,
    GrpcServer,
    server_options,
    start_grpc_server,
)
from bidi_responses.server.transports.grpc.servicer import ResponsesServicer

__all__ = [
    "SERVICE_NAME",
    "Delivery",
    "GrpcServer",
    "ResponsesServicer",
    "StreamsPerConnection",
    "server_options",
    "start_grpc_server",
]
