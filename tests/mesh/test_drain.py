"""SIGTERM under load: health flips first, no request is lost, streams end UNAVAILABLE."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import orjson
import pytest
import websockets
from bidi_responses.codec import EventDecoder, params_to_pb
from bidi_responses.server.core.storage.sqlite_schema import read_ledger
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2

from tests.conftest import ServerFactory, make_config, read_message
from tests.mesh.conftest import after_one_turn, health_stub

TERMINAL = ("response.completed", "response.incomplete", "response.failed")


@dataclass
class Tally:
    """What each request became."""

    started: set[str] = field(default_factory=set)
    completed: set[str] = field(default_factory=set)
    refused: int = 0
    lost: list[str] = field(default_factory=list)
    stream_ends: list[str] = field(default_factory=list)
    warned: int = 0
    loaded: asyncio.Event = field(default_factory=asyncio.Event)

    def complete(self, response_id: str) -> None:
        self.completed.add(response_id)
        if len(self.completed) >= 30:
            self.loaded.set()


async def _connect_worker(stub: Any, tally: Tally) -> None:
    call = stub.Connect()
    decoder = EventDecoder()
    previous: str | None = None
    warned = told_to_go = False
    try:
        while True:
            body: dict[str, Any] = {"model": "sim-model", "input": "go on", "store": True}
            if previous:
                body["previous_response_id"] = previous
            await call.write(pb.ConnectRequest(response_create=params_to_pb(body)))
            current: str | None = None
            while True:
                message = await call.read()
                if message == grpc.aio.EOF:
                    raise EOFError
                event = decoder.event(message)
                kind = event["type"]
                if kind == "warning":
                    assert event["code"] == "server_draining"
                    warned = True
                elif kind == "response.created":
                    current = event["response"]["id"]
                    tally.started.add(current)
                elif kind in TERMINAL:
                    tally.complete(event["response"]["id"])
                    previous, current = event["response"]["id"], None
                    break
                elif kind == "error":
                    assert event["error"]["code"] == "server_shutting_down", event
                    tally.refused += 1
                    told_to_go = True
                    break
            if warned or told_to_go:
                # Told to go: send nothing more and read the stream to the server's end of it
                # (after the warning, a half-close is fine too: the end is the server's).
                if warned:
                    await call.done_writing()
                while True:
                    message = await call.read()
                    if message == grpc.aio.EOF:
                        break
                    warned = warned or decoder.event(message)["type"] == "warning"
                break
    except (EOFError, grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
        pass
    code = (await call.code()).name
    # A stream the server had not picked up before the drain began is refused outright.
    tally.warned += warned or (previous is None and code == "UNAVAILABLE")
    tally.stream_ends.append(code)


async def _http_worker(port: int, tally: Tally) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        while True:
            try:
                reply = await http.post("/v1/responses", json={"model": "sim-model", "input": "x"})
            except httpx.ConnectError:
                tally.refused += 1  # never sent: the listener had closed
                return
            except httpx.HTTPError as error:
                tally.lost.append(f"http: {error!r}")
                return
            if reply.status_code == 503:
                assert reply.json()["error"]["code"] == "server_shutting_down"
                tally.refused += 1
                return
            assert reply.status_code == 200, reply.text
            tally.started.add(reply.json()["id"])
            tally.complete(reply.json()["id"])


async def _ws_worker(port: int, tally: Tally) -> None:
    try:
        async with websockets.connect(f"ws://127.0.0.1:{port}/v1/responses") as ws:
            while True:
                await ws.send(
                    orjson.dumps(
                        {"type": "response.create", "model": "sim-model", "input": "y"}
                    ).decode()
                )
                while True:
                    event = orjson.loads(await ws.recv())
                    if event["type"] == "response.created":
                        tally.started.add(event["response"]["id"])
                    elif event["type"] in TERMINAL:
                        tally.complete(event["response"]["id"])
                        break
                    elif event["type"] == "error":
                        assert event["error"]["code"] == "server_shutting_down", event
                        tally.refused += 1
                        # Told to go: send nothing more; the server closes the socket.
                        while True:
                            await ws.recv()
    except websockets.ConnectionClosed as closed:
        tally.stream_ends.append(f"ws-{closed.rcvd.code if closed.rcvd else 'none'}")
    except (OSError, websockets.InvalidStatus):
        tally.refused += 1


async def test_sigterm_under_load_loses_nothing(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bidi_responses.server.cli", "serve",
        "--grpc-port", "0", "--http-port", "0", "--data-dir", str(tmp_path),
        "--sim-tps", "3000", "--sim-ttft-ms", "5", "--grace-period-s", "20",
        "--drain-notice-s", "0.3",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    tally = Tally()
    try:
        async with asyncio.timeout(90):
            assert process.stdout is not None
            line = (await process.stdout.readline()).decode()
            found = re.search(r"gRPC on 127\.0\.0\.1:(\d+), .*http://127\.0\.0\.1:(\d+)/v1", line)
            assert found, line
            assert "loopback only because no API keys are configured" in line
            grpc_port, http_port = int(found[1]), int(found[2])
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}")
            probe_channel = grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}")
            stub = pb_grpc.ResponsesServiceStub(channel)
            health = health_stub(probe_channel)
            workers = [asyncio.ensure_future(_connect_worker(stub, tally)) for _ in range(4)]
            workers += [asyncio.ensure_future(_http_worker(http_port, tally)) for _ in range(3)]
            workers += [asyncio.ensure_future(_ws_worker(http_port, tally)) for _ in range(2)]
            # Under load: the workers have finished 30 responses and keep going.
            await tally.loaded.wait()
            process.send_signal(signal.SIGTERM)
            flipped_at: float | None = None
            closed_at: float | None = None
            while closed_at is None:
                try:
                    reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.NOT_SERVING:
                        flipped_at = flipped_at or time.monotonic()
                except grpc.aio.AioRpcError:
                    closed_at = time.monotonic()
                await asyncio.sleep(0.01)
            await asyncio.gather(*workers)
            assert await process.wait() == 0
            await channel.close()
            await probe_channel.close()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert flipped_at is not None and flipped_at < closed_at, "health must flip first"
    assert not tally.lost, tally.lost
    unfinished = tally.started - tally.completed
    assert not unfinished, f"{len(unfinished)} started responses never finished"
    # Every Connect stream was warned (or refused at once) and ended UNAVAILABLE; WebSockets
    # closed 1012.
    assert tally.warned == 4
    assert sorted(tally.stream_ends) == ["UNAVAILABLE"] * 4 + ["ws-1012"] * 2
    ledger = {row.response_id for row in read_ledger(tmp_path / "responses.db")}
    assert tally.completed <= ledger
    print(  # the figures docs/results.md quotes (pytest -s)
        f"drain: {len(tally.completed)} completed, {tally.refused} refused with "
        f"server_shutting_down or before connecting, {len(tally.lost)} lost"
    )


async def test_during_the_drain_new_work_is_refused_on_every_transport(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    """In the drain notice window: health NOT_SERVING, new streams and requests refused with
    ``server_shutting_down``, the open stream warned and then ended UNAVAILABLE."""
    config = make_config(tmp_path)
    config.drain_notice_s = 1.0
    running = await server_factory(config, http=True)
    target = f"127.0.0.1:{running.grpc_port}"
    async with (
        asyncio.timeout(30),
        grpc.aio.insecure_channel(target) as channel,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{running.http_port}") as http,
    ):
        stub = pb_grpc.ResponsesServiceStub(channel)
        health = health_stub(channel)
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
        assert (
            await read_message(watch, health_pb2.HealthCheckResponse)
        ).status == health_pb2.HealthCheckResponse.SERVING
        decoder = EventDecoder()
        open_stream = await after_one_turn(stub, decoder)
        stopping = asyncio.ensure_future(running.stop())
        assert (
            await read_message(watch, health_pb2.HealthCheckResponse)
        ).status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert (await http.get("/readyz")).status_code == 503
        refused = stub.Connect()
        await refused.write(pb.ConnectRequest(response_create=params_to_pb(
            {"model": "sim-model", "input": "hi"})))  # fmt: skip
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await refused.read()
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert dict(caught.value.trailing_metadata() or ())["error-code"] == "server_shutting_down"
        request = pb.CreateResponseRequest(
            params=params_to_pb({"model": "sim-model", "input": "x"})
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in stub.CreateResponse(request):
                pass
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        reply = await http.post("/v1/responses", json={"model": "sim-model", "input": "x"})
        assert reply.status_code == 503
        assert reply.json()["error"]["code"] == "server_shutting_down"
        with pytest.raises(websockets.InvalidStatus) as denied:
            async with websockets.connect(f"ws://127.0.0.1:{running.http_port}/v1/responses"):
                pass
        assert denied.value.response.status_code == 503
        # The open stream: a warning, then UNAVAILABLE (never OK or INTERNAL).
        warning = decoder.event(await read_message(open_stream, pb.ConnectResponse))
        assert warning["type"] == "warning" and warning["code"] == "server_draining"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await open_stream.read()
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        await stopping
