"""A Node client (@grpc/grpc-js, proto-loader) runs a chained loop on one Connect stream."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest
from bidi_responses.server.app import RunningServer

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "interop" / "node" / "agent_loop.js"


async def test_node_agent_loop_sees_cached_tokens_grow(keyed_server: RunningServer) -> None:
    node = shutil.which("node")
    if node is None or not (ROOT / "node_modules" / "@grpc" / "grpc-js").is_dir():
        pytest.fail("needs node and the pinned npm packages: run `make node-deps` (make test does)")
    process = await asyncio.create_subprocess_exec(
        node,
        str(SCRIPT),
        f"127.0.0.1:{keyed_server.grpc_port}",
        "5",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "API_KEY": "key-a"},
    )
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    lines = [json.loads(line) for line in out.decode().splitlines()]
    cached = [int(line["cached_tokens"]) for line in lines if "turn" in line]
    assert len(cached) == 5 and cached == sorted(cached) and cached[0] < cached[-1]
    assert lines[-1] == {"ok": True, "turns": 5}
