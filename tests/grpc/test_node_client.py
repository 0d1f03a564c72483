"""A stock grpc-js client (proto loaded at run time) with and without batched events."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from bidi_responses.server.app import RunningServer

from tests.conftest import ServerFactory

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("node_connect.js")
STEER_SCRIPT = Path(__file__).with_name("node_steer.js")


async def _node_turn(port: int, batch: bool) -> dict[str, Any]:
    return await _node_script(SCRIPT, port, "batch" if batch else "single")


async def _node_script(script: Path, port: int, *args: str) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed (it is only needed for this interoperability test)")
    assert (ROOT / "node_modules" / "@grpc" / "grpc-js").is_dir(), (
        "run `make lint-proto` (npm ci) to install the pinned grpc-js"
    )
    process = await asyncio.create_subprocess_exec(
        node,
        str(script),
        f"127.0.0.1:{port}",
        str(ROOT / "protos"),
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    result: dict[str, Any] = json.loads(out)
    return result


@pytest.mark.parametrize("batch", [False, True])
async def test_grpc_js_client_reads_single_and_batched_events(
    server: RunningServer, batch: bool
) -> None:
    seen = await _node_turn(server.grpc_port, batch)
    types = seen["types"]
    assert types[0] == "response_created" and types[-1] == "response_completed"
    assert seen["sequence"] == list(range(len(types)))
    if batch:
        assert seen["batches"] >= 1 and seen["messages"] < len(types)
    else:
        assert seen["batches"] == 0 and seen["messages"] == len(types)


async def test_grpc_js_client_steers_a_response(server_factory: ServerFactory) -> None:
    """Steering from stubs built from the proto alone: the acknowledgement, the target
    ending ``steered``, and its automatic successor on the same lane."""
    # The first token comes late, so the steer sent at response.created lands before it.
    running: RunningServer = await server_factory(
        tokens_per_second=200, answer_tokens=40, ttft_ms=1500
    )
    seen = await _node_script(STEER_SCRIPT, running.grpc_port)
    assert "error" not in seen and "failed" not in seen, seen
    target, successor = seen["responses"]
    assert seen["accepted"]["previous_response_id"] == target["id"]
    assert seen["accepted"]["id"].startswith("steer")
    assert target["status"] == "incomplete" and target["reason"] == "steered"
    assert successor["status"] == "completed"
    assert successor["previous_response_id"] == target["id"]
    # Every event of the lane, the acknowledgement included, echoes it.
    assert set(seen["lanes"]) == {"a"}
    assert seen["events"].index("response_steer_accepted") < seen["events"].index(
        "response_incomplete"
    )
