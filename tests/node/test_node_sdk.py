"""The official openai Node SDK (pinned in tests/node/package.json, installed here with
``npm ci``): compact, input_tokens.count, models, responses.parse and background mode; and
WebSocket mode's lanes and steering through ``ResponsesWS`` and ``ResponsesWebSocketSession``."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from bidi_responses.server.app import RunningServer

from tests.conftest import ServerFactory, background_config

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def node_sdk() -> Path:
    """``tests/node`` with its pinned packages installed (``npm ci``, once per lock file)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, "node and npm are needed for the Node SDK tests"
    stamp = HERE / "node_modules" / ".installed"
    lock = HERE / "package-lock.json"
    if not stamp.exists() or stamp.stat().st_mtime < lock.stat().st_mtime:
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=HERE,
            check=True,
            timeout=300,
        )
        stamp.touch()
    return HERE


async def test_node_sdk_surface(
    node_sdk: Path, server_factory: ServerFactory, tmp_path: Path
) -> None:
    config = background_config(tmp_path)
    server: RunningServer = await server_factory(config, http=True)
    process = await asyncio.create_subprocess_exec(
        "node",
        str(node_sdk / "sdk_surface.mjs"),
        f"http://127.0.0.1:{server.http_port}/v1",
        "sim-model",
        "sim-other",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(60):
            out, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()
    result: dict[str, Any] = json.loads(out)

    compact = result["compact"]
    assert compact["object"] == "response.compaction"
    assert compact["types"] == ["message", "compaction"]
    assert compact["usage"]["total_tokens"] > 0
    assert compact["follow_status"] == "completed"
    assert compact["missing_model"] == {
        "status": 400,
        "param": "model",
        "code": "missing_required_parameter",
    }

    tokens = result["input_tokens"]
    assert tokens["object"] == "response.input_tokens"
    assert tokens["counted"] == tokens["used"] > 0

    assert result["models"] == {
        "ids": ["sim-model", "sim-other"],
        "retrieved": "sim-model",
        "owned_by": "sim",
        "unknown": 404,
    }

    parsed = result["parse"]
    assert parsed["format"] == "json_schema"
    assert set(parsed["parsed"]) == {"x", "label"}
    assert isinstance(parsed["parsed"]["x"], int) and parsed["parsed"]["x"] >= 0

    assert result["background"] == {
        "queued_status": "queued",
        "background": True,
        "cancelled": "cancelled",
        "after": "cancelled",
    }
    resume = result["resume"]
    assert resume["numbers"] == list(range(len(resume["numbers"])))
    assert resume["last"] == "response.completed"
    assert resume["text_matches"] is True


async def test_node_sdk_lanes_and_steering_over_websocket_mode(
    node_sdk: Path, server_factory: ServerFactory
) -> None:
    """``ResponsesWS`` steering and the ``ResponsesWebSocketSession`` lane helper, unchanged,
    against WebSocket mode."""
    # The first token comes late, so a steer sent at response.created lands before it.
    server: RunningServer = await server_factory(
        http=True, tokens_per_second=400, answer_tokens=40, ttft_ms=1000
    )
    result = await _run_node(
        node_sdk / "ws_lanes_steer.mjs", f"http://127.0.0.1:{server.http_port}/v1", "sim-model"
    )
    assert "raw_error" not in result and "helper_error" not in result, result

    steer = result["steer"]
    refused, accepted, late = steer["acks"]
    assert refused["type"] == "response.steer.failed" and refused["code"] == "invalid_input"
    assert "input[0]" in refused["message"] and refused["stream_id"] == "s"
    assert refused["input"] == [{"type": "function_call_output", "call_id": "c1", "output": "ok"}]
    assert accepted["type"] == "response.steer.accepted" and accepted["stream_id"] == "s"
    target = steer["target"]
    assert accepted["previous_response_id"] == target["id"]
    assert (target["status"], target["reason"]) == ("incomplete", "steered")
    assert steer["successor"]["status"] == "completed"
    assert steer["successor"]["previous_response_id"] == target["id"]
    assert steer["successor_lane"] == "s"
    # A steer for a response that has ended: refused, on its lane; the connection goes on.
    assert (late["code"], late["stream_id"]) == ("response_already_completed", "s")
    assert late["input"] == "too late"
    assert result["lane_limit"] == "websocket_stream_limit_reached"

    helper = result["helper"]
    assert [helper[k]["status"] for k in ("first", "second", "fork")] == ["completed"] * 3
    assert helper["first"]["id"] != helper["second"]["id"]
    assert helper["fork"]["previous_response_id"] == helper["second"]["id"]
    assert (helper["steered"]["status"], helper["steered"]["reason"]) == ("incomplete", "steered")
    assert helper["successor"]["previous_response_id"] == helper["steered"]["id"]
    assert helper["successor"]["status"] == "completed"


async def _run_node(script: Path, *args: str) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        "node",
        str(script),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(60):
            out, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()
    result: dict[str, Any] = json.loads(out)
    return result
