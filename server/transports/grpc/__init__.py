"""The gRPC transport: ``ResponsesService`` on grpc.aio.

The servicer only converts between protobuf and the core's dicts; sessions, caches and rules
live in the core. A Connect call is one Session (``connect.py``); ``CreateResponse`` is one
stateless create (``create.py``); the other calls are one core call each (``servicer.py``).
Requests are decoded in the handlers and every error becomes a chosen status
(``registration.py``, ``status.py``); the listener, health, reflection, TLS and keepalive are
set up in ``server.py`` and ``health.py``.
"""

from .connect import StreamsPerConnection
from .delivery import Delivery
from .server import (
    SERVICE_NAME,
    GrpcServer,
    server_options,
    start_grpc_server,
)
from .servicer import ResponsesServicer

__all__ = [
    "SERVICE_NAME",
    "Delivery",
    "GrpcServer",
    "ResponsesServicer",
    "StreamsPerConnection",
    "server_options",
    "start_grpc_server",
]
