"""grpc.health.v1 and server reflection from stock clients; HTTP health endpoints."""

from __future__ import annotations

import asyncio

import grpc
import httpx
from bidi_responses.server.app import RunningServer
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tests.mesh.conftest import health_stub

SERVICE = "bidi_responses.v1.ResponsesService"


async def test_health_serves_per_service_name(
    keyed_server: RunningServer, channel: grpc.aio.Channel
) -> None:
    async with asyncio.timeout(10):
        health = health_stub(channel)
        for name in ("", SERVICE):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=name))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, name
        try:
            await health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
            raise AssertionError("an unknown service name must be NOT_FOUND")
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.NOT_FOUND
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{keyed_server.http_port}") as h:
            for path in ("/healthz", "/readyz"):
                reply_http = await h.get(path)  # probes need no API key
                assert reply_http.status_code == 200 and reply_http.json() == {"status": "ok"}


async def test_reflection_lists_and_describes(keyed_server: RunningServer) -> None:
    """What ``grpcurl list`` and ``grpcurl describe`` do, with the stock reflection client
    (a blocking client: it runs in a thread while the server serves on this loop)."""
    async with asyncio.timeout(20):
        await asyncio.to_thread(_list_and_describe, keyed_server.grpc_port)


def _list_and_describe(port: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= (
            services
        )
        pool = DescriptorPool(database)
        service = pool.FindServiceByName(SERVICE)
        connect = service.methods_by_name["Connect"]
        assert connect.client_streaming and connect.server_streaming
        assert connect.input_type.full_name == "bidi_responses.v1.ConnectRequest"
        request = pool.FindMessageTypeByName("bidi_responses.v1.ConnectRequest")
        assert {"stream_id", "response_create", "event_id"} <= set(request.fields_by_name)
        assert set(service.methods_by_name) >= {
            "Connect",
            "CreateResponse",
            "GetResponse",
            "DeleteResponse",
            "ListInputItems",
            "CancelResponse",
            "GetStats",
        }


V1_REFLECTION = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"


async def test_reflection_v1_lists_and_describes(keyed_server: RunningServer) -> None:
    """Current tools (grpcurl, grpcui, Postman) ask for ``grpc.reflection.v1`` first. The
    stock reflection client speaking v1: the same messages on the wire, at v1's method path."""
    async with asyncio.timeout(20):
        await asyncio.to_thread(_list_and_describe_v1, keyed_server.grpc_port)


def _list_and_describe_v1(port: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        database._stub.ServerReflectionInfo = channel.stream_stream(
            V1_REFLECTION,
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        services = set(database.get_services())
        assert {SERVICE, "grpc.reflection.v1.ServerReflection"} <= services
        pool = DescriptorPool(database)
        service = pool.FindServiceByName(SERVICE)
        assert service.methods_by_name["Connect"].client_streaming
        # Reflection describes itself in v1 too: grpcurl's `describe` of the v1 service.
        v1 = pool.FindServiceByName("grpc.reflection.v1.ServerReflection")
        method = v1.methods_by_name["ServerReflectionInfo"]
        assert method.input_type.full_name == "grpc.reflection.v1.ServerReflectionRequest"
        assert v1.file.package == "grpc.reflection.v1"
