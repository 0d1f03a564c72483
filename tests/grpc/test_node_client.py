"""A stock grpc-js client (proto loaded at run time) with and without batched events."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from bidi_responses.server.app import RunningServer

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("node_connect.js")


async def _node_turn(port: int, batch: bool) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed (it is only needed for this interoperability test)")
    assert (ROOT / "node_modules" / "@grpc" / "grpc-js").is_dir(), (
        "run `make lint-proto` (npm ci) to install the pinned grpc-js"
    )
    process = await asyncio.create_subprocess_exec(
        node,
        str(SCRIPT),
        f"127.0.0.1:{port}",
        str(ROOT / "protos"),
        "batch" if batch else "single",
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
