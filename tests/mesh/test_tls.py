"""TLS and mTLS on gRPC, HTTP and WebSocket, with certificates made at run time."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import grpc
import httpx
import orjson
import pytest
import websockets
from bidi_responses.server.app import RunningServer
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import ServerFactory, make_config
from tests.mesh.certs import Pki, make_pki


async def _tls_server(
    factory: ServerFactory, tmp_path: Path, mutual: bool
) -> tuple[RunningServer, Pki]:
    pki = make_pki(tmp_path)
    config = make_config(tmp_path)
    config.tls.cert_file = str(pki.server_cert)
    config.tls.key_file = str(pki.server_key)
    if mutual:
        config.tls.client_ca_file = str(pki.ca)
    running: RunningServer = await factory(config, http=True)
    return running, pki


async def _grpc_health(port: int, credentials: grpc.ChannelCredentials | None) -> int:
    target = f"127.0.0.1:{port}"
    options = [("grpc.use_local_subchannel_pool", 1)]
    channel = (
        grpc.aio.secure_channel(target, credentials, options=options)
        if credentials is not None
        else grpc.aio.insecure_channel(target, options=options)
    )
    async with channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
        return int(reply.status)


def _client_ssl(pki: Pki, with_cert: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if with_cert:
        context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    return context


async def _ws_roundtrip(port: int, context: ssl.SSLContext) -> str:
    async with websockets.connect(f"wss://127.0.0.1:{port}/v1/responses", ssl=context) as ws:
        await ws.send(orjson.dumps({"type": "response.create", "model": "sim-model",
                                    "input": "hi"}).decode())  # fmt: skip
        while True:
            event = orjson.loads(await ws.recv())
            if event["type"] in ("response.completed", "error"):
                return str(event["type"])


async def test_tls_on_grpc_http_and_websocket(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    running, pki = await _tls_server(server_factory, tmp_path, mutual=False)
    ca = pki.ca.read_bytes()
    async with asyncio.timeout(30):
        serving = health_pb2.HealthCheckResponse.SERVING
        assert await _grpc_health(running.grpc_port, grpc.ssl_channel_credentials(ca)) == serving
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _grpc_health(running.grpc_port, None)  # plaintext is refused
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        context = _client_ssl(pki, with_cert=False)
        async with httpx.AsyncClient(verify=context) as http:
            base = f"https://127.0.0.1:{running.http_port}"
            reply = await http.post(
                f"{base}/v1/responses", json={"model": "sim-model", "input": "x"}
            )
            assert reply.status_code == 200 and reply.json()["status"] == "completed"
        assert await _ws_roundtrip(running.http_port or 0, context) == "response.completed"


async def test_mtls_requires_a_client_certificate(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    running, pki = await _tls_server(server_factory, tmp_path, mutual=True)
    ca, cert, key = pki.ca.read_bytes(), pki.client_cert.read_bytes(), pki.client_key.read_bytes()
    port = running.http_port or 0
    async with asyncio.timeout(30):
        with_cert = grpc.ssl_channel_credentials(ca, private_key=key, certificate_chain=cert)
        serving = health_pb2.HealthCheckResponse.SERVING
        assert await _grpc_health(running.grpc_port, with_cert) == serving
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _grpc_health(running.grpc_port, grpc.ssl_channel_credentials(ca))
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        async with httpx.AsyncClient(verify=_client_ssl(pki, with_cert=True)) as http:
            assert (await http.get(f"https://127.0.0.1:{port}/healthz")).status_code == 200
        async with httpx.AsyncClient(verify=_client_ssl(pki, with_cert=False)) as http:
            with pytest.raises(httpx.HTTPError):
                await http.get(f"https://127.0.0.1:{port}/healthz")
        assert await _ws_roundtrip(port, _client_ssl(pki, with_cert=True)) == "response.completed"
        with pytest.raises((OSError, websockets.InvalidHandshake)):
            await _ws_roundtrip(port, _client_ssl(pki, with_cert=False))
