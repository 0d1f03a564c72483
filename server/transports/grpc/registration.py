"""Registering the servicer: raw-bytes requests, and every error as a chosen status.

grpc.aio runs the request deserializer itself; when it fails on a stream-stream call the call
is left open with no status. Taking bytes and decoding in the handler turns every undecodable
message into a status (or an error event) this server chooses. Every handler is guarded the
same way: an ``ApiError`` ends the call with its status (and is counted), a server fault with
a logged, generic INTERNAL (never Python exception text in the status details).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from bidi_responses.codec import wire_bytes
from bidi_responses.v1 import responses_pb2 as pb
from google.protobuf.message import Message

from ...core.api import ApiError, server_error
from ...core.observability import Metrics
from ...core.tenancy import RequestBytes
from .context import Context
from .decoding import decode_request
from .servicer import ResponsesServicer
from .status import abort

log = logging.getLogger("bidi_responses.grpc")

SERVICE = pb.DESCRIPTOR.services_by_name["ResponsesService"]

# The streaming calls whose servicer methods take raw bytes and yield serialized messages
# (built by ``ProtoEncoder.event_bytes``): streams must survive an undecodable message.
PRE_SERIALIZED = frozenset({"Connect", "CreateResponse"})

UnaryMethod = Callable[[Any, Context], Awaitable[Message]]
StreamMethod = Callable[[Any, Context], AsyncGenerator[Any, None]]


@contextlib.asynccontextmanager
async def _statuses(metrics: Metrics, context: Context, name: str) -> AsyncIterator[None]:
    """End the call with the status of whatever the block raises."""
    try:
        yield
    except (asyncio.CancelledError, grpc.aio.AbortError):
        raise
    except ApiError as error:
        metrics.error("grpc", error.status, error.code)
        await abort(context, error)
    except Exception:
        log.exception("%s failed", name)
        await abort(context, server_error())


def _unary(
    metrics: Metrics,
    budget: RequestBytes,
    copies: int,
    method: UnaryMethod,
    request_class: type[Message],
    name: str,
) -> Any:
    """A unary handler that decodes its own request."""

    @functools.wraps(method)
    async def handler(raw: bytes, context: Context) -> Message:
        async with _statuses(metrics, context, name):
            # The request's bytes are alive while the call runs: charged to the server-wide
            # budget until it ends.
            with budget.holding(len(raw) * copies):
                return await method(decode_request(request_class, raw, name), context)
        raise AssertionError("unreachable: the guard ends the call")

    return handler


def _stream(
    metrics: Metrics,
    budget: RequestBytes,
    copies: int,
    method: StreamMethod,
    request_class: type[Message] | None,
    name: str,
) -> Any:
    """A streaming handler; it decodes its request first unless ``request_class`` is None (the
    method takes the raw request)."""

    @functools.wraps(method)
    async def handler(request: Any, context: Context) -> AsyncIterator[Any]:
        async with _statuses(metrics, context, name):
            # A raw request (not a request stream) is alive while the call runs: charged to
            # the server-wide budget until it ends.
            size = len(request) * copies if isinstance(request, bytes) else 0
            with budget.holding(size):
                if request_class is not None:
                    request = decode_request(request_class, request, name)
                # Closed with the call, so its cleanup runs now (not when collected).
                async with contextlib.aclosing(method(request, context)) as events:
                    async for out in events:
                        yield out

    return handler


def add_servicer(servicer: ResponsesServicer, server: grpc.aio.Server) -> None:
    """Register every method of ``ResponsesService`` with a raw-bytes request deserializer."""
    core = servicer.core
    metrics, budget, copies = core.metrics, core.request_bytes, core.naming.one_shot_copies
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in SERVICE.methods:
        name = method.name
        request_class = getattr(pb, method.input_type.name)
        response_class = getattr(pb, method.output_type.name)
        impl = getattr(servicer, name)
        serializer = wire_bytes if name in PRE_SERIALIZED else response_class.SerializeToString
        decoded = None if name in PRE_SERIALIZED else request_class
        if method.client_streaming and method.server_streaming:
            handlers[name] = grpc.stream_stream_rpc_method_handler(
                _stream(metrics, budget, copies, impl, None, name),
                request_deserializer=None,
                response_serializer=serializer,
            )
        elif method.server_streaming:
            handlers[name] = grpc.unary_stream_rpc_method_handler(
                _stream(metrics, budget, copies, impl, decoded, name),
                request_deserializer=None,
                response_serializer=serializer,
            )
        else:
            assert inspect.iscoroutinefunction(impl)
            handlers[name] = grpc.unary_unary_rpc_method_handler(
                _unary(metrics, budget, copies, impl, request_class, name),
                request_deserializer=None,
                response_serializer=serializer,
            )
    generic = grpc.method_handlers_generic_handler(SERVICE.full_name, handlers)
    server.add_generic_rpc_handlers((generic,))
    server.add_registered_method_handlers(SERVICE.full_name, handlers)
