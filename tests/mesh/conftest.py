"""Fixtures for the service-mesh tests: servers with API keys, and raw stubs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from bidi_responses.server.app import RunningServer
from bidi_responses.server.config import ServerConfig
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from tests.conftest import ServerFactory, make_config

KEYS = {"key-a": "tenant-a", "key-b": "tenant-b"}


def keyed_config(tmp_path: Path, **sim: Any) -> ServerConfig:
    """A config with two API keys, one per tenant."""
    config = make_config(tmp_path, **sim)
    config.auth.api_keys = dict(KEYS)
    return config


def bearer(key: str) -> tuple[tuple[str, str], ...]:
    """gRPC metadata carrying ``key``."""
    return (("authorization", f"Bearer {key}"),)


def error_info(error: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    """The ErrorInfo detail of a failed call (asserting it has one)."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, "no google.rpc.Status details"
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    raise AssertionError(f"no ErrorInfo in {status}")


@pytest.fixture
async def keyed_server(server_factory: ServerFactory, tmp_path: Path) -> RunningServer:
    """gRPC, HTTP and WebSocket with API keys for tenant-a and tenant-b."""
    running: RunningServer = await server_factory(keyed_config(tmp_path), http=True)
    return running


@pytest.fixture
async def channel(keyed_server: RunningServer) -> AsyncIterator[grpc.aio.Channel]:
    """A plaintext channel to ``keyed_server``."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{keyed_server.grpc_port}") as ch:
        yield ch


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> Any:
    """The generated ResponsesService stub."""
    return pb_grpc.ResponsesServiceStub(channel)  # type: ignore[no-untyped-call]
