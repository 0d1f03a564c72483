"""Modes 4, 5 and 11: one WebSocket connection with JSON text frames (``websockets``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import orjson

from ..jsontypes import JSONObject
from ..wire import WireCounter
from .commands import SteerRound
from .exchange import Exchange, wire_snapshot
from .steering import steer_round_ws

if TYPE_CHECKING:
    from ssl import SSLContext

    from websockets.asyncio.client import ClientConnection

__all__ = ["WsConn", "WsTurns"]


async def connect_ws(
    base: str, *, batch: bool = False, ssl: SSLContext | None = None
) -> ClientConnection:
    """A WebSocket-mode connection to the server at ``base`` (no compression, no frame size
    limit, as the OpenAI SDK connects); ``batch`` asks for the non-standard batched frames;
    ``ssl``: over TLS (wss)."""
    from websockets.asyncio.client import connect

    url = base.replace("https://", "wss://", 1).replace("http://", "ws://", 1) + "/v1/responses"
    if batch:
        url += "?batch_frames=1"
    return await connect(url, max_size=None, compression=None, open_timeout=30, ssl=ssl)


class WsTurns:
    """A turn as WebSocket mode's frames: a create or an append sent, its events read until
    the turn ends (``_exchange``: on a connection of its own, or on a lane of a shared one)."""

    async def _exchange(self, message: JSONObject) -> Exchange:
        raise NotImplementedError

    async def create(self, body: JSONObject) -> Exchange:
        """A ``response.create`` frame."""
        return await self._exchange({"type": "response.create", **body})

    async def append(self, response_id: str, items: list[JSONObject]) -> Exchange:
        """A ``response.append`` frame."""
        return await self._exchange(
            {"type": "response.append", "response_id": response_id, "input": items}
        )


class WsConn(WsTurns):
    """One WebSocket connection on GET /v1/responses, JSON text frames."""

    def __init__(self, ws: ClientConnection, wire: WireCounter | None) -> None:
        self._ws = ws
        self._wire = wire

    @classmethod
    async def open(
        cls,
        base: str,
        wire: WireCounter | None,
        batch: bool = False,
        ssl: SSLContext | None = None,
    ) -> WsConn:
        """Connect (no compression, no frame size limit, as the OpenAI SDK connects);
        ``batch`` asks for the non-standard batched frames; ``ssl``: over TLS (wss)."""
        return cls(await connect_ws(base, batch=batch, ssl=ssl), wire)

    async def _exchange(self, message: JSONObject) -> Exchange:
        ex = Exchange(t_send=time.perf_counter(), messages=0)
        await self._ws.send(orjson.dumps(message).decode())
        while True:
            frame = orjson.loads(await self._ws.recv())
            ex.messages = (ex.messages or 0) + 1
            for event in frame if isinstance(frame, list) else (frame,):
                if ex.observe(event):
                    ex.wire_after = wire_snapshot(self._wire)
                    return ex

    async def steer_round(self, body: JSONObject) -> SteerRound:
        """A create steered at its ``response.created``, followed to its successor's end."""
        return await steer_round_ws(self._ws, body)

    async def aclose(self, abort: bool = False) -> None:
        """Close the socket (the server cancels anything still waiting)."""
        await self._ws.close()
