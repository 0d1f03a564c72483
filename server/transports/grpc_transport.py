"""The gRPC transport: ``ResponsesService`` on grpc.aio.

The servicer only converts between protobuf and the core's dicts; sessions, caches and rules
live in the core. A Connect call is one Session: a reader task feeds client messages to it and
the call's response stream writes what it produces. When the client goes away the session is
closed in ``finally``, which cancels in-flight engine work.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from bidi_responses.codec import (
    EVENT_FIELD,
    MessageDecodeError,
    ProtoDecoder,
    ProtoEncoder,
    batch_messages,
    decode_message,
    field_bytes,
    item_to_dict,
    item_to_pb,
    usage_to_pb,
    wire_bytes,
)
from bidi_responses.server.config import ServerConfig, StreamingConfig, TlsConfig
from bidi_responses.server.core.errors import ApiError, server_error
from bidi_responses.server.core.events import OutEvent, error_event
from bidi_responses.server.core.limits import limit_exceeded
from bidi_responses.server.core.service import ResponsesCore
from bidi_responses.server.tracing import grpc_interceptors
from bidi_responses.server.transports.grpc_status import abort, error_from_event
from bidi_responses.server.transports.health import add_health_service, mark_draining
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection

# How long a refused Connect call waits for the client's first message before its status.
_REFUSAL_READ_S = 1.0

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ResponsesService"].full_name

_SHUTTING_DOWN = ApiError(
    "The server is shutting down and takes no new streams; retry on another replica.",
    code="server_shutting_down",
    status=503,
    type="server_error",
)


log = logging.getLogger("bidi_responses.grpc")


def _undecodable(error: MessageDecodeError, method: str) -> ApiError:
    """The 400 for a message that cannot be decoded, logged once as a WARNING."""
    log.warning("%s: undecodable request refused: %s", method, error.message)
    return ApiError(error.message, code="invalid_message", param=error.param)


def _authorization(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return value if isinstance(value, str) else value.decode()
    return None


@dataclass(slots=True)
class Delivery:
    """How one Connect stream or CreateResponse call wants its events (``DeliveryOptions``)."""

    max_events: int = 1
    max_bytes: int = 0
    slim: bool = False

    @classmethod
    def from_pb(cls, options: pb.DeliveryOptions, streaming: StreamingConfig) -> Delivery:
        """Checked options, within the server's bounds (ApiError naming the bad field)."""
        detail = options.snapshot_detail
        if detail not in (
            pb.SNAPSHOT_DETAIL_UNSPECIFIED,
            pb.SNAPSHOT_DETAIL_FULL,
            pb.SNAPSHOT_DETAIL_SLIM,
        ):
            raise ApiError(
                f"Invalid 'delivery.snapshot_detail': unknown value {detail} (expected "
                "SNAPSHOT_DETAIL_FULL or SNAPSHOT_DETAIL_SLIM).",
                param="delivery.snapshot_detail",
            )
        max_events = 1
        if options.batch_events:
            max_events = streaming.max_batch_events
            if options.max_batch_events:
                max_events = min(max_events, options.max_batch_events)
        return cls(max(max_events, 1), streaming.max_batch_bytes, detail == pb.SNAPSHOT_DETAIL_SLIM)

    def messages(self, encoder: ProtoEncoder, ready: Iterable[OutEvent]) -> list[bytes]:
        """The events that are ready, as serialized ``ConnectResponse`` messages (batched if
        this delivery asks for it)."""
        messages = [encoder.event_bytes(out.lane, out.data) for out in ready]
        if self.max_events > 1 and len(messages) > 1:
            return batch_messages(messages, self.max_events, self.max_bytes)
        return messages


def _write_timeout(seconds: float) -> ApiError:
    """The status of a stream cut off because its client stopped reading."""
    return ApiError(
        f"The client read nothing for {seconds:g} s (write timeout); the stream was closed "
        "and its in-flight responses cancelled.",
        code="write_timeout",
        status=429,
        type="server_error",
    )


class ResponsesServicer(pb_grpc.ResponsesServiceServicer):
    """Protobuf in, core calls, protobuf out. Holds no state of its own."""

    def __init__(self, core: ResponsesCore) -> None:
        self._core = core
        # Open Connect streams per HTTP/2 connection (the peer address names the connection).
        self._per_connection: dict[str, int] = {}

    async def _caller(
        self, context: grpc.aio.ServicerContext[Any, Any]
    ) -> tuple[str | None, str | None]:
        """(tenant, quota key) of the call; ends it with UNAUTHENTICATED if keys are on and the
        key is missing or wrong. The key itself is never logged or echoed."""
        try:
            return self._authenticate(context)
        except ApiError as error:
            await self._refuse(context, error)
            raise

    def _authenticate(
        self, context: grpc.aio.ServicerContext[Any, Any]
    ) -> tuple[str | None, str | None]:
        authorization = _authorization(context)
        keys = self._core.keys
        tenant = keys.authenticate(authorization)
        return tenant, tenant or keys.label(authorization)

    async def _refuse_stream(
        self,
        request_iterator: AsyncIterator[Any],
        context: grpc.aio.ServicerContext[Any, Any],
        error: ApiError,
    ) -> None:
        """End a Connect call that cannot be served, after its first client message.

        A status sent before the client's first write races that write, and grpcio clients
        then report their own INTERNAL instead of our status; reading one message (or waiting
        briefly for it) lets every client see the real code.
        """
        with contextlib.suppress(Exception):
            async with asyncio.timeout(_REFUSAL_READ_S):
                await anext(aiter(request_iterator), None)
        await self._refuse(context, error)

    async def _refuse(self, context: grpc.aio.ServicerContext[Any, Any], error: ApiError) -> None:
        self._core.metrics.error("grpc", error.status, error.code)
        await abort(context, error)

    # Pre-serialized (see _PreSerialized): these yield encoded bytes, not messages.
    async def Connect(  # type: ignore[override]
        self,
        request_iterator: AsyncIterator[bytes],
        context: grpc.aio.ServicerContext[bytes, pb.ConnectResponse],
    ) -> AsyncIterator[bytes]:
        """The stateful stream. Requests arrive as raw bytes and are decoded here, so one that
        cannot be decoded becomes an ``error`` event and the stream goes on (grpc.aio would
        otherwise leave the call hanging); messages go out pre-serialized."""
        core = self._core
        peer = context.peer()
        per_connection = self._per_connection.get(peer, 0)
        limit = core.config.tenant_limits.max_streams_per_connection
        try:
            tenant, quota = self._authenticate(context)
            if core.draining:
                raise _SHUTTING_DOWN
            if limit and per_connection >= limit:
                core.metrics.limited.labels("max_streams_per_connection").inc()
                raise limit_exceeded(
                    "max_streams_per_connection", limit, "open streams per connection"
                )
            session = core.open_session("grpc", tenant=tenant, quota_key=quota)
        except ApiError as error:
            await self._refuse_stream(request_iterator, context, error)
            raise
        self._per_connection[peer] = per_connection + 1
        streaming = core.config.streaming
        decoder = ProtoDecoder()
        encoder = ProtoEncoder()
        delivery = Delivery()
        label = quota if tenant is None else None
        write_timeout = core.config.limits.write_timeout_s

        async def read() -> None:
            nonlocal delivery
            try:
                # context.read() rather than request_iterator: grpc's iterator keeps the last
                # message alive while it waits for the next, and an idle stream must not hold
                # its last message (it may be megabytes of input the cache budget does not see).
                while True:
                    raw: object = await context.read()
                    if raw is grpc.aio.EOF or not isinstance(raw, bytes):
                        break
                    received = time.perf_counter()
                    try:
                        request = decode_message(pb.ConnectRequest, raw)
                    except MessageDecodeError as problem:
                        error = _undecodable(problem, "Connect")
                        await session.emit("", error_event(400, error.to_error_object()))
                        continue
                    finally:
                        del raw
                    if request.HasField("delivery"):
                        # Applies to everything the session emits from here on.
                        try:
                            delivery = Delivery.from_pb(request.delivery, streaming)
                        except ApiError as error:
                            await session.emit(
                                request.stream_id,
                                error_event(error.status, error.to_error_object()),
                            )
                            continue
                        encoder.slim = delivery.slim
                        if request.WhichOneof("event") is None:
                            continue  # options only
                    event = decoder.client_event(request)
                    del request
                    if label is not None and event.get("type") == "response.create":
                        # Open server: the token's label stands in for a tenant in the ledger.
                        event.setdefault("user", label)
                    await session.handle(event, received)
                    del event
            except Exception:
                # Reading failed on the server's side: end the call rather than leave it open.
                log.exception("Connect: reading the client's messages failed")
            await session.finish()

        # Headers first, on their own: a stalled client must not leave them pending with a
        # large first message, or the status that cuts it off could not be sent.
        await context.send_initial_metadata(())
        loop = asyncio.get_running_loop()
        reader = loop.create_task(read(), name="connect-reader")
        session.start_age_limit()
        # When the pending write began (None: none pending). A write waits while HTTP/2 flow
        # control says the client's window is full: a client that stopped reading is cut off
        # instead of held forever.
        write_started: float | None = None

        async def watch_writes() -> None:
            while True:
                started = write_started
                wait = write_timeout / 4
                if started is not None:
                    wait = min(wait, started + write_timeout - loop.time())
                    if wait <= 0:
                        break
                await asyncio.sleep(wait)
            core.counters.write_timeouts += 1
            await core.close_session(session)  # cancels in-flight engine work
            with contextlib.suppress(Exception):
                await abort(context, _write_timeout(write_timeout))

        watchdog = loop.create_task(watch_writes(), name="connect-write-watch")
        try:
            # Take every event that is ready; one message each, or batched if asked for.
            async for ready in session.event_batches(streaming.max_batch_events):
                for message in delivery.messages(encoder, ready):
                    write_started = loop.time()
                    yield message
                    write_started = None
            if session.end_error is not None:
                # The server ended the stream (age limit, drain): a status that says so, so
                # clients and meshes retry elsewhere instead of reading it as success.
                await abort(context, session.end_error)
        finally:
            watchdog.cancel()
            reader.cancel()
            await asyncio.gather(reader, watchdog, return_exceptions=True)
            await core.close_session(session)  # cancels in-flight engine work
            left = self._per_connection.get(peer, 1) - 1
            if left > 0:
                self._per_connection[peer] = left
            else:
                self._per_connection.pop(peer, None)

    async def CreateResponse(  # type: ignore[override]
        self,
        request: bytes,
        context: grpc.aio.ServicerContext[bytes, pb.CreateResponseResponse],
    ) -> AsyncIterator[bytes]:
        """The stateless baseline: one call per turn (pre-serialized, like Connect)."""
        core = self._core
        tenant, quota = await self._caller(context)
        try:
            create = decode_message(pb.CreateResponseRequest, request)
        except MessageDecodeError as problem:
            await self._refuse(context, _undecodable(problem, "CreateResponse"))
            raise
        if core.draining:
            await self._refuse(context, _SHUTTING_DOWN)
        try:
            delivery = Delivery.from_pb(create.delivery, core.config.streaming)
        except ApiError as error:
            await self._refuse(context, error)
            raise
        body = ProtoDecoder().params_to_dict(create.params)
        if tenant is None and quota is not None:
            body.setdefault("user", quota)  # open server: the token's label for the ledger
        encoder = ProtoEncoder(slim=delivery.slim)
        if body.get("background") is True:
            # The response runs on its own; this call only reads its event log, so dropping
            # the call leaves it running (resume with StreamResponse).
            try:
                first = await self._core.background.start(body, "grpc-unary", tenant, quota)
            except ApiError as error:
                await self._refuse(context, error)
                raise
            if first["type"] == "error":
                yield field_bytes(EVENT_FIELD, encoder.event_bytes("", first))
                await abort(context, error_from_event(first))
                return
            async for data in self._core.background.events(first["response"]["id"], -1, tenant):
                yield field_bytes(EVENT_FIELD, encoder.event_bytes("", data))
            return
        failure: ApiError | None = None
        if delivery.max_events <= 1:
            async for data in core.stateless(body, "grpc-unary", tenant, quota):
                yield field_bytes(EVENT_FIELD, encoder.event_bytes("", data))
                if data["type"] == "error":
                    failure = error_from_event(data)
        else:
            batches = core.stateless_batches(body, "grpc-unary", delivery.max_events, tenant, quota)
            async with contextlib.aclosing(batches):
                async for ready in batches:
                    for message in delivery.messages(encoder, (OutEvent("", d) for d in ready)):
                        yield field_bytes(EVENT_FIELD, message)
                    for data in ready:
                        if data["type"] == "error":
                            failure = error_from_event(data)
        if failure is not None:
            # A request error ends the call with its status, never OK.
            await abort(context, failure)

    async def GetResponse(
        self,
        request: pb.GetResponseRequest,
        context: grpc.aio.ServicerContext[pb.GetResponseRequest, pb.GetResponseResponse],
    ) -> pb.GetResponseResponse:
        """A stored response."""
        tenant, _ = await self._caller(context)
        try:
            response = await self._core.get_response(request.response_id, tenant)
        except ApiError as error:
            await self._refuse(context, error)
            raise
        return pb.GetResponseResponse(response=ProtoEncoder().response_to_pb(response))

    async def DeleteResponse(
        self,
        request: pb.DeleteResponseRequest,
        context: grpc.aio.ServicerContext[pb.DeleteResponseRequest, pb.DeleteResponseResponse],
    ) -> pb.DeleteResponseResponse:
        """Delete a stored response."""
        tenant, _ = await self._caller(context)
        try:
            result = await self._core.delete_response(request.response_id, tenant)
        except ApiError as error:
            await self._refuse(context, error)
            raise
        return pb.DeleteResponseResponse(
            id=result["id"], object=result["object"], deleted=result["deleted"]
        )

    async def ListInputItems(
        self,
        request: pb.ListInputItemsRequest,
        context: grpc.aio.ServicerContext[pb.ListInputItemsRequest, pb.ListInputItemsResponse],
    ) -> pb.ListInputItemsResponse:
        """Page through a stored response's input items."""
        tenant, _ = await self._caller(context)
        try:
            page = await self._core.list_input_items(
                request.response_id,
                limit=request.limit or 20,
                order=request.order or "desc",
                after=request.after or None,
                tenant=tenant,
            )
        except ApiError as error:
            await self._refuse(context, error)
            raise
        return pb.ListInputItemsResponse(
            object="list",
            data=[item_to_pb(i) for i in page["data"]],
            first_id=page["first_id"] or "",
            last_id=page["last_id"] or "",
            has_more=page["has_more"],
        )

    async def CancelResponse(
        self,
        request: pb.CancelResponseRequest,
        context: grpc.aio.ServicerContext[pb.CancelResponseRequest, pb.CancelResponseResponse],
    ) -> pb.CancelResponseResponse:
        """Cancel an in-flight response by id."""
        tenant, _ = await self._caller(context)
        try:
            response = await self._core.cancel_response(request.response_id, tenant)
        except ApiError as error:
            await self._refuse(context, error)
            raise
        return pb.CancelResponseResponse(response=ProtoEncoder().response_to_pb(response))

    async def GetStats(
        self,
        request: pb.GetStatsRequest,
        context: grpc.aio.ServicerContext[pb.GetStatsRequest, pb.GetStatsResponse],
    ) -> pb.GetStatsResponse:
        """Cumulative counters."""
        await self._caller(context)
        return pb.GetStatsResponse(**self._core.stats())

    async def CompactResponse(
        self,
        request: pb.CompactResponseRequest,
        context: grpc.aio.ServicerContext[pb.CompactResponseRequest, pb.CompactResponseResponse],
    ) -> pb.CompactResponseResponse:
        """Compact a conversation (``POST /v1/responses/compact``)."""
        body: dict[str, Any] = {
            "model": request.model,
            "input": [item_to_dict(i) for i in request.input],
        }
        for name in ("instructions", "previous_response_id"):
            if request.HasField(name):
                body[name] = getattr(request, name)
        tenant, quota = await self._caller(context)
        if tenant is None and quota is not None:
            body["user"] = quota  # open server: the token's label stands in for a tenant
        try:
            result = await self._core.compact(body, "grpc-unary", tenant)
        except ApiError as error:
            await self._refuse(context, error)
            raise
        return pb.CompactResponseResponse(
            id=result["id"],
            object=result["object"],
            created_at=result["created_at"],
            output=[item_to_pb(i) for i in result["output"]],
            usage=usage_to_pb(result["usage"]),
        )

    async def CountInputTokens(
        self,
        request: pb.CountInputTokensRequest,
        context: grpc.aio.ServicerContext[pb.CountInputTokensRequest, pb.CountInputTokensResponse],
    ) -> pb.CountInputTokensResponse:
        """Count a create's prompt tokens (``POST /v1/responses/input_tokens``)."""
        tenant, _ = await self._caller(context)
        body = ProtoDecoder().params_to_dict(request.params)
        try:
            result = await self._core.count_input_tokens(body, tenant)
        except ApiError as error:
            await self._refuse(context, error)
            raise
        return pb.CountInputTokensResponse(**result)

    async def ListModels(
        self,
        request: pb.ListModelsRequest,
        context: grpc.aio.ServicerContext[pb.ListModelsRequest, pb.ListModelsResponse],
    ) -> pb.ListModelsResponse:
        """The configured models (``GET /v1/models``)."""
        await self._caller(context)
        listing = self._core.list_models()
        return pb.ListModelsResponse(
            object=listing["object"], data=[pb.Model(**m) for m in listing["data"]]
        )

    async def GetModel(
        self,
        request: pb.GetModelRequest,
        context: grpc.aio.ServicerContext[pb.GetModelRequest, pb.GetModelResponse],
    ) -> pb.GetModelResponse:
        """One configured model (``GET /v1/models/{model}``)."""
        await self._caller(context)
        try:
            model = self._core.get_model(request.model)
        except ApiError as error:
            await self._refuse(context, error)
            raise
        return pb.GetModelResponse(model=pb.Model(**model))

    async def StreamResponse(
        self,
        request: pb.StreamResponseRequest,
        context: grpc.aio.ServicerContext[pb.StreamResponseRequest, pb.StreamResponseResponse],
    ) -> AsyncIterator[pb.StreamResponseResponse]:
        """Resume a background response's events after ``starting_after``."""
        tenant, _ = await self._caller(context)
        starting_after = request.starting_after if request.HasField("starting_after") else -1
        try:
            if starting_after < -1:
                raise ApiError("Invalid 'starting_after': expected >= 0.", param="starting_after")
            events = self._core.background.events(request.response_id, starting_after, tenant)
        except ApiError as error:
            await self._refuse(context, error)
            raise
        encoder = ProtoEncoder()
        async for data in events:
            yield pb.StreamResponseResponse(event=encoder.connect_response("", data))


# The streaming calls whose servicer methods yield serialized messages (bytes).
_PRE_SERIALIZED = frozenset({"Connect", "CreateResponse"})


def server_options(config: ServerConfig) -> list[tuple[str, Any]]:
    """Channel arguments of the listener: message limits, keepalive, connection age."""
    limit = config.limits.max_message_bytes
    ka = config.keepalive
    return [
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", limit),
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
    core: ResponsesCore, host: str, port: int, options: list[tuple[str, Any]] | None = None
) -> GrpcServer:
    """Start the gRPC server: the API, grpc.health.v1 and server reflection (``port`` 0 picks
    a free one)."""
    config = core.config
    server = grpc.aio.server(
        options=server_options(config) + list(options or ()),
        interceptors=grpc_interceptors(config.tracing),
    )
    _add_servicer(ResponsesServicer(core), server)
    health_servicer = await add_health_service(server)
    # NOT_SERVING as soon as a drain begins, while the listener is still open.
    core.drain_hooks.append(lambda: mark_draining(health_servicer))
    reflection.enable_server_reflection(
        (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    address = f"{host}:{port}"
    if config.tls.enabled:
        bound = server.add_secure_port(address, _credentials(config.tls))
    else:
        bound = server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {address}")
    await server.start()
    return GrpcServer(server, bound)


# -- registration with raw-bytes requests ---------------------------------------------------

_SERVICE = pb.DESCRIPTOR.services_by_name["ResponsesService"]
# Methods that decode their own requests (streams must survive an undecodable message).
_DECODES_ITSELF = frozenset({"Connect", "CreateResponse"})


def _unary(
    method: Callable[..., Any], request_class: Any, name: str
) -> Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Any]:
    """A unary handler that decodes its request itself: undecodable → INVALID_ARGUMENT."""

    @functools.wraps(method)
    async def handler(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            request = decode_message(request_class, raw)
        except MessageDecodeError as problem:
            await abort(context, _undecodable(problem, name))
            raise
        return await method(request, context)

    return handler


def _decoding_stream(
    method: Callable[..., AsyncIterator[Any]], request_class: Any, name: str
) -> Callable[..., AsyncIterator[Any]]:
    """A server-streaming handler that decodes its request itself (→ INVALID_ARGUMENT)."""

    @functools.wraps(method)
    async def handler(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            request = decode_message(request_class, raw)
        except MessageDecodeError as problem:
            await abort(context, _undecodable(problem, name))
            raise
        async for out in method(request, context):
            yield out

    return handler


def _guarded_stream(
    method: Callable[..., AsyncIterator[Any]], name: str
) -> Callable[..., AsyncIterator[Any]]:
    """A streaming handler whose server faults end the call with a logged, generic INTERNAL
    (never Python exception text in the status details)."""

    @functools.wraps(method)
    async def handler(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            async for out in method(request, context):
                yield out
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception:
            log.exception("%s failed", name)
            await abort(context, server_error())

    return handler


def _guarded_unary(method: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A unary handler whose server faults end with a logged, generic INTERNAL."""

    @functools.wraps(method)
    async def handler(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await method(request, context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception:
            log.exception("%s failed", name)
            await abort(context, server_error())
            raise

    return handler


def _add_servicer(servicer: ResponsesServicer, server: grpc.aio.Server) -> None:
    """Register every method with a raw-bytes request deserializer.

    grpc.aio runs the request deserializer itself; when it fails on a stream-stream call the
    call is left open with no status. Taking bytes and decoding in the handler turns every
    undecodable message into a status (or an error event) this server chooses.
    """
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in _SERVICE.methods:
        name = method.name
        request_class = getattr(pb, method.input_type.name)
        response_class = getattr(pb, method.output_type.name)
        impl = getattr(servicer, name)
        # The streaming calls send bytes built by ``ProtoEncoder.event_bytes``.
        serializer = wire_bytes if name in _PRE_SERIALIZED else response_class.SerializeToString
        if method.client_streaming and method.server_streaming:
            handlers[name] = grpc.stream_stream_rpc_method_handler(
                _guarded_stream(impl, name),
                request_deserializer=None,
                response_serializer=serializer,
            )
        elif method.server_streaming:
            stream_impl = (
                impl if name in _DECODES_ITSELF else _decoding_stream(impl, request_class, name)
            )
            handlers[name] = grpc.unary_stream_rpc_method_handler(
                _guarded_stream(stream_impl, name),
                request_deserializer=None,
                response_serializer=serializer,
            )
        else:
            assert inspect.iscoroutinefunction(impl)
            handlers[name] = grpc.unary_unary_rpc_method_handler(
                _guarded_unary(_unary(impl, request_class, name), name),
                request_deserializer=None,
                response_serializer=serializer,
            )
    generic = grpc.method_handlers_generic_handler(_SERVICE.full_name, handlers)
    server.add_generic_rpc_handlers((generic,))
    server.add_registered_method_handlers(_SERVICE.full_name, handlers)
