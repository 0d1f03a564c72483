"""Fixtures for WebSocket mode: a server with HTTP on and a small raw-frame client."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
import websockets
from bidi_responses.server.app import RunningServer

TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete"})


class RawSocket:
    """A WebSocket-mode client that shows every frame as it arrived."""

    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws

    async def send(self, event: dict[str, Any] | str | bytes) -> None:
        """Send a JSON event (a dict) or a raw text/binary frame."""
        await self.ws.send(orjson.dumps(event).decode() if isinstance(event, dict) else event)

    async def recv(self) -> dict[str, Any]:
        """The next frame, which must be one JSON object in a text frame."""
        frame = await self.ws.recv()
        assert isinstance(frame, str), "the server sends text frames only"
        event = orjson.loads(frame)
        assert isinstance(event, dict)
        return event

    async def turn(self) -> list[dict[str, Any]]:
        """Frames up to and including the turn's end (terminal, error or response.done)."""
        events = []
        while True:
            event = await self.recv()
            events.append(event)
            if event["type"] in TERMINAL or event["type"] in ("error", "response.done"):
                return events

    async def create(self, **body: Any) -> list[dict[str, Any]]:
        """Send response.create and return its events to the end of the turn."""
        await self.send({"type": "response.create", **body})
        return await self.turn()


def final(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The response of a turn's last event (asserting it has one)."""
    last = events[-1]
    assert "response" in last, last
    response: dict[str, Any] = last["response"]
    return response


def error_of(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The nested error object of a turn that ended in an ``error`` event (checking its shape)."""
    assert len(events) == 1, [e["type"] for e in events]
    event = events[0]
    assert event["type"] == "error", event
    assert isinstance(event["status"], int) and 400 <= event["status"] < 600
    error: dict[str, Any] = event["error"]
    assert {"type", "code", "message", "param"} <= set(error)
    assert isinstance(error["code"], str) and isinstance(error["message"], str)
    return error


Connect = Callable[..., contextlib.AbstractAsyncContextManager[RawSocket]]


def connector(port: int) -> Connect:
    """``async with connect() as sock`` opens WebSocket mode on ``port``."""

    @contextlib.asynccontextmanager
    async def connect(**options: Any) -> AsyncIterator[RawSocket]:
        async with websockets.connect(
            f"ws://127.0.0.1:{port}/v1/responses", max_size=None, **options
        ) as ws:
            yield RawSocket(ws)

    return connect


@pytest.fixture
def connect(http_server: RunningServer) -> Connect:
    """Open raw WebSocket-mode connections to ``http_server``."""
    assert http_server.http_port is not None
    return connector(http_server.http_port)
