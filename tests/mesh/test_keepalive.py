"""Client keepalive pings during a long idle tool run: the stream survives.

The short test uses the same mechanism as the real one (a client that pings faster than the
server's default tolerance would turn away), scaled down: the server accepts pings every 0.5 s
and the client pings every second through a 4 s idle wait. A control run with a strict server
shows the same client being cut off, so the test can fail. The 35 s run with 10 s pings and
the default settings is marked slow.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from bidi_responses.codec import EventDecoder, params_to_pb
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc

from tests.conftest import SHELL_TOOL, ServerFactory, make_config


async def _idle_tool_run(port: int, ping_ms: int, idle_s: float) -> str:
    """One append-mode turn whose tool takes ``idle_s``; returns how the turn ended."""
    options = [
        ("grpc.keepalive_time_ms", ping_ms),
        ("grpc.keepalive_timeout_ms", 5000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        stub = pb_grpc.ResponsesServiceStub(channel)  # type: ignore[no-untyped-call]
        call = stub.Connect()
        decoder = EventDecoder()
        body: dict[str, Any] = {
            "model": "sim-model",
            "input": "run the tests",
            "tools": [SHELL_TOOL],
            "append_mode": True,
        }
        try:
            await call.write(pb.ConnectRequest(response_create=params_to_pb(body)))
            done: dict[str, Any] | None = None
            async for message in call:
                event = decoder.event(message)
                if event["type"] == "response.done":
                    done = event
                    break
            assert done is not None
            await asyncio.sleep(idle_s)  # the tool run: nothing on the stream, only pings
            outputs = [
                {"type": "function_call_output", "call_id": c["call_id"], "output": "ok"}
                for c in done["pending_calls"]
            ]
            await call.write(
                pb.ConnectRequest(
                    response_append=pb.ResponseAppend(
                        response_id=done["response"]["id"],
                        input=params_to_pb({"model": "m", "input": outputs}).input,
                    )
                )
            )
            async for message in call:
                event = decoder.event(message)
                if event["type"] in ("response.completed", "response.incomplete", "response.done"):
                    return str(event["type"])
            return "ended"
        except grpc.aio.AioRpcError as error:
            return f"{error.code().name}: {error.details()}"
        except asyncio.InvalidStateError:  # the call ended while the client was idle
            return f"{(await call.code()).name}: {await call.details()}"
        finally:
            call.cancel()


async def test_idle_tool_run_with_fast_pings_survives(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    config = make_config(tmp_path, tool_rounds=1)
    config.keepalive.min_client_ping_interval_s = 0.5
    running = await server_factory(config)
    async with asyncio.timeout(30):
        assert await _idle_tool_run(running.grpc_port, 1000, 4.0) == "response.completed"


async def test_a_strict_server_cuts_the_same_client_off(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    config = make_config(tmp_path, tool_rounds=1)
    config.keepalive.min_client_ping_interval_s = 30
    running = await server_factory(config)
    async with asyncio.timeout(30):
        outcome = await _idle_tool_run(running.grpc_port, 1000, 4.0)
    assert outcome.startswith("UNAVAILABLE"), outcome


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_35_s_idle_tool_run_with_10_s_pings_survives(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    """The issue's case, on the default server settings."""
    running = await server_factory(make_config(tmp_path, tool_rounds=1))
    async with asyncio.timeout(90):
        assert await _idle_tool_run(running.grpc_port, 10_000, 35.0) == "response.completed"
