"""The non-standard batched WebSocket frames: only on request, never on the standard wire."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import websockets
from bidi_responses.server.app import RunningServer

from tests.ws.conftest import TERMINAL


async def _frames(port: int, query: str) -> list[Any]:
    async with websockets.connect(
        f"ws://127.0.0.1:{port}/v1/responses{query}", max_size=None
    ) as ws:
        await ws.send(
            orjson.dumps({"type": "response.create", "model": "sim-model", "input": "hi"}).decode()
        )
        frames: list[Any] = []
        while True:
            frame = orjson.loads(await ws.recv())
            frames.append(frame)
            last = frame[-1] if isinstance(frame, list) else frame
            if last["type"] in TERMINAL or last["type"] == "error":
                return frames


async def test_batched_frames_only_when_asked(http_server: RunningServer) -> None:
    assert http_server.http_port is not None
    async with asyncio.timeout(20):
        standard = await _frames(http_server.http_port, "")
        batched = await _frames(http_server.http_port, "?batch_frames=1")
    assert all(isinstance(f, dict) for f in standard)
    lists = [f for f in batched if isinstance(f, list)]
    assert lists and all(len(f) > 1 for f in lists)
    events = [e for f in batched for e in (f if isinstance(f, list) else [f])]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events][:2] == ["response.created", "response.in_progress"]
    assert len(batched) < len(events)
