"""A create is typed when it arrives: an invalid one queued behind a busy lane is refused at
once, through a real server and WebSocket mode, not when its turn would have come."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
import websockets

from tests.conftest import SHELL_TOOL, ServerFactory

pytestmark = pytest.mark.timeout(60)


async def _next(ws: websockets.ClientConnection) -> dict[str, Any]:
    frame = await ws.recv()
    event = orjson.loads(frame)
    assert isinstance(event, dict)
    return event


async def _send(ws: websockets.ClientConnection, event: dict[str, Any]) -> None:
    await ws.send(orjson.dumps(event).decode())


async def test_an_invalid_create_behind_a_busy_lane_is_refused_before_the_lane_frees(
    server_factory: ServerFactory,
) -> None:
    running = await server_factory(http=True)
    url = f"ws://127.0.0.1:{running.http_port}/v1/responses"
    async with asyncio.timeout(30), websockets.connect(url, max_size=None) as ws:
        # Busy: an append-mode response waits for its tool outputs (no timing involved).
        await _send(
            ws,
            {
                "type": "response.create",
                "model": "sim-model",
                "input": "ls",
                "tools": [SHELL_TOOL],
                "append_mode": True,
            },
        )
        while (event := await _next(ws))["type"] != "response.done":
            pass
        busy = event["response"]["id"]
        # Behind it on the lane: an invalid create, then a valid one.
        await _send(
            ws,
            {
                "type": "response.create",
                "event_id": "evt_bad",
                "model": "sim-model",
                "input": "hi",
                "temperature": 5,
                "previous_response_id": busy,
            },
        )
        await _send(ws, {"type": "response.create", "model": "sim-model", "input": "next"})
        refused = await _next(ws)
        assert refused["type"] == "error", refused
        assert refused["error"]["param"] == "temperature"
        assert refused["error"]["event_id"] == "evt_bad"
        assert refused["error"]["request_type"] == "response.create"
        assert refused["error"]["response_id"] == busy
        # The busy response is still in flight: it ends when cancelled, then the valid create
        # runs in its turn.
        await _send(ws, {"type": "response.cancel", "response_id": busy})
        ended = await _next(ws)
        assert (ended["type"], ended["response"]["id"]) == ("response.incomplete", busy)
        kinds = []
        while (event := await _next(ws))["type"] not in ("response.completed", "error"):
            kinds.append(event["type"])
        assert kinds[0] == "response.created"
        assert event["type"] == "response.completed"
