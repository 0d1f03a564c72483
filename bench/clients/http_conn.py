"""Modes 1-3: POST /v1/responses with SSE, over aiohttp."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import orjson

from ..jsontypes import JSONObject
from ..wire import WireCounter
from .exchange import BenchError, Exchange, wire_snapshot

if TYPE_CHECKING:
    import aiohttp

__all__ = ["HttpConn"]


class HttpConn:
    """POST /v1/responses with ``stream: true``, events read from SSE."""

    def __init__(self, session: aiohttp.ClientSession, base: str, wire: WireCounter | None) -> None:
        self._session = session
        self._url = f"{base}/v1/responses"
        self._wire = wire

    async def create(self, body: JSONObject) -> Exchange:
        """One POST; the connection is reused or not according to the session's connector."""
        ex = Exchange(t_send=time.perf_counter(), messages=0)  # SSE events
        payload = orjson.dumps({**body, "stream": True})
        async with self._session.post(
            self._url, data=payload, headers={"Content-Type": "application/json"}
        ) as resp:
            if resp.status != 200:
                text = await resp.text()
                raise BenchError(f"HTTP {resp.status}: {text[:500]}")
            buffer = b""
            done = False
            async for chunk in resp.content.iter_any():
                if done:
                    continue  # drain to EOF so that keep-alive can reuse the connection
                buffer += chunk
                while not done:
                    cut = buffer.find(b"\n\n")
                    if cut < 0:
                        break
                    block, buffer = buffer[:cut], buffer[cut + 2 :]
                    for line in block.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            continue
                        ex.messages = (ex.messages or 0) + 1
                        if ex.observe(orjson.loads(data)):
                            done = True
                            # Before the connection closes (mode 1 closes it per turn).
                            ex.wire_after = wire_snapshot(self._wire)
                            break
            if not done:
                raise BenchError("the SSE stream ended before the response did")
        return ex

    async def append(self, response_id: str, items: list[JSONObject]) -> Exchange:
        """HTTP has no append (the prototype shape needs a stream)."""
        raise BenchError("append mode is not served over HTTP")

    async def aclose(self, abort: bool = False) -> None:
        """The session is owned by whoever created it."""
