"""Several agents on one WebSocket connection, each on its own lane (``stream_id``).

WebSocket mode runs each lane's creates in order and interleaves the events of different lanes
on the one connection, each named lane's events echoing its ``stream_id``. One reader task
takes every frame off the socket and hands each event to its lane's queue; an agent's view
(``WsLaneConn``) sends its turns with its ``stream_id`` and reads its own queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

import orjson

from ..jsontypes import JSONObject
from .exchange import BenchError, Exchange
from .ws_conn import WsTurns, connect_ws

if TYPE_CHECKING:
    from ssl import SSLContext

    from websockets.asyncio.client import ClientConnection

__all__ = ["WsLaneConn", "WsLanes"]


class WsLanes:
    """One WebSocket connection shared by lanes: the socket and its reader task."""

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        # Per lane: its events, then None when the connection ends.
        self._queues: dict[str, asyncio.Queue[JSONObject | None]] = {}
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, base: str, ssl: SSLContext | None = None) -> WsLanes:
        """Connect as ``WsConn.open`` does (``connect_ws``)."""
        return cls(await connect_ws(base, ssl=ssl))

    def lane(self, name: str) -> WsLaneConn:
        """An agent's view: its turns on lane ``name``."""
        if not name:
            raise ValueError("a shared connection's agents each need a named lane")
        self._queues[name] = asyncio.Queue()
        return WsLaneConn(self, name)

    async def send(self, message: JSONObject) -> None:
        await self._ws.send(orjson.dumps(message).decode())

    async def next_event(self, lane: str) -> JSONObject:
        event = await self._queues[lane].get()
        if event is None:
            raise BenchError(f"the WebSocket connection ended before lane {lane}'s turn did")
        return event

    async def _read(self) -> None:
        try:
            async for frame in self._ws:
                event = orjson.loads(frame)
                lane = event.get("stream_id")
                queue = self._queues.get(lane) if isinstance(lane, str) else None
                if queue is None:
                    # An event of no lane of ours (an error about a frame, say) ends every
                    # waiting turn: the run is not valid.
                    for waiting in self._queues.values():
                        waiting.put_nowait(event)
                else:
                    queue.put_nowait(event)
        finally:
            for queue in self._queues.values():
                queue.put_nowait(None)

    async def aclose(self) -> None:
        """Close the socket and stop the reader."""
        await self._ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class WsLaneConn(WsTurns):
    """One agent's turns on its lane of a shared WebSocket connection (each frame names
    the lane; an append's response names it too)."""

    def __init__(self, lanes: WsLanes, lane: str) -> None:
        self._lanes = lanes
        self._lane = lane

    async def _exchange(self, message: JSONObject) -> Exchange:
        ex = Exchange(t_send=time.perf_counter(), messages=0)
        await self._lanes.send({**message, "stream_id": self._lane})
        while True:
            event = await self._lanes.next_event(self._lane)
            ex.messages = (ex.messages or 0) + 1
            if ex.observe(event):
                return ex

    async def aclose(self, abort: bool = False) -> None:
        """Nothing of its own: the connection is closed by its owner."""
