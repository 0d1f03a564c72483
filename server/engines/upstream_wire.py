"""The two wires to an upstream Responses API: WebSocket mode and ``POST /responses`` (SSE).

``UpstreamWire.stream`` sends one ``response.create`` body over the lane's link and yields the
translated engine events, under the first-event and idle deadlines. A lane's ``LaneLink``
holds its WebSocket connection; when the upgrade is refused under ``transport = "auto"`` the
link falls back to HTTP for good. Failures before anything was streamed raise
``RetryableError`` (the engine may send the turn again), later ones ``EngineError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
import orjson
from bidi_responses.schema import JSONObject, JSONValue
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from ..core.ports import EngineError, EngineEvent
from .http_backend import (
    RetryableError,
    SessionPool,
    SSELineSplitter,
    broken_stream,
    error_message,
    sse_data,
)
from .upstream_events import UpstreamTurn, translate_raw

if TYPE_CHECKING:
    from ..engine_config import UpstreamConfig

__all__ = ["LaneLink", "UpstreamWire"]


@dataclass(slots=True)
class LaneLink:
    """One lane's link to the upstream: its connection and where the upstream chain stands."""

    ws: ClientConnection | None = None
    http_only: bool = False
    upstream_id: str | None = None
    # The conversation the chain belongs to (the lane's item list) and how many of its items
    # the upstream already has.
    items: Sequence[Mapping[str, JSONValue]] | None = None
    count: int = 0

    def forget_chain(self) -> None:
        """The upstream's chain no longer matches the lane's: the next turn sends it all."""
        self.upstream_id = None
        self.items = None

    async def close(self) -> None:
        """Close the lane's WebSocket connection (the next turn opens another)."""
        ws, self.ws = self.ws, None
        if ws is not None:
            await ws.close()


class UpstreamWire:
    """Sends turns to one upstream (``config.base_url``) over WebSocket mode or HTTP."""

    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        base = config.base_url.rstrip("/")
        self.http_url = base + "/responses"
        self.ws_url = (
            "wss://" + base[len("https://") :]
            if base.startswith("https://")
            else "ws://" + base.removeprefix("http://")
        ) + "/responses"
        self._sessions = SessionPool(config.connect_timeout_s)

    async def aclose(self) -> None:
        """Close the HTTP connection pool (lanes close their own WebSocket connections)."""
        await self._sessions.aclose()

    def stream(
        self, link: LaneLink, body: JSONObject, headers: dict[str, str], turn: UpstreamTurn
    ) -> AsyncIterator[EngineEvent]:
        """One turn over the link's wire."""
        if link.http_only:
            return self._over_http(body, headers, turn)
        return self._over_ws(link, body, headers, turn)

    async def _relay(
        self,
        receive: Callable[[], Awaitable[list[str | bytes]]],
        turn: UpstreamTurn,
        deadline: float,
    ) -> AsyncIterator[EngineEvent]:
        """Translate the events ``receive`` brings until the terminal one. ``deadline`` is for
        the first event; once the turn streams, each receive gets the idle timeout instead."""
        loop = asyncio.get_running_loop()
        while not turn.terminal:
            async with asyncio.timeout_at(deadline):
                received = await receive()
            for raw in received:
                for event in translate_raw(raw, turn):
                    yield event
                if turn.terminal:
                    break
            if turn.streamed:
                deadline = loop.time() + self.config.idle_timeout_s

    def _timeout(self, turn: UpstreamTurn) -> EngineError:
        config = self.config
        limit = config.idle_timeout_s if turn.streamed else config.first_event_timeout_s
        return EngineError("engine_timeout", f"The upstream sent nothing for {limit:g} s.")

    # -- WebSocket mode ----------------------------------------------------------------------

    async def _open_ws(self, link: LaneLink, headers: dict[str, str]) -> ClientConnection | None:
        config = self.config
        try:
            link.ws = await connect(
                self.ws_url,
                additional_headers=headers,
                open_timeout=config.connect_timeout_s,
                max_size=config.max_message_bytes,
                compression=None,
            )
        except InvalidStatus as exc:
            if config.transport == "auto":
                link.http_only = True  # the upstream refuses WebSocket mode: HTTP from now on
                return None
            raise EngineError(
                "engine_unavailable",
                f"The upstream refused WebSocket mode ({exc.response.status_code}).",
            ) from None
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            raise RetryableError(
                "engine_unavailable", f"The upstream at {self.ws_url} is unreachable: {exc}."
            ) from None
        return link.ws

    async def _over_ws(
        self, link: LaneLink, body: JSONObject, headers: dict[str, str], turn: UpstreamTurn
    ) -> AsyncIterator[EngineEvent]:
        ws = link.ws
        if ws is None:
            ws = await self._open_ws(link, headers)
            if ws is None:  # fell back to HTTP
                async for event in self._over_http(body, headers, turn):
                    yield event
                return
        deadline = asyncio.get_running_loop().time() + self.config.first_event_timeout_s

        async def receive() -> list[str | bytes]:
            return [await ws.recv()]

        try:
            await ws.send(orjson.dumps({"type": "response.create", **body}).decode())
            async for event in self._relay(receive, turn, deadline):
                yield event
        except TimeoutError:
            await link.close()
            raise self._timeout(turn) from None
        except ConnectionClosed as exc:
            link.ws = None
            message = f"The upstream closed the WebSocket connection ({exc})."
            raise broken_stream(message, streamed=turn.streamed, fresh=True) from None

    # -- HTTP --------------------------------------------------------------------------------

    async def _over_http(
        self, body: JSONObject, headers: dict[str, str], turn: UpstreamTurn
    ) -> AsyncIterator[EngineEvent]:
        deadline = asyncio.get_running_loop().time() + self.config.first_event_timeout_s
        response: aiohttp.ClientResponse | None = None
        try:
            async with asyncio.timeout_at(deadline):
                response = await self._sessions.get().post(
                    self.http_url, json={**body, "stream": True}, headers=headers
                )
            if response.status != 200:
                text = (await response.content.read(2000)).decode("utf-8", "replace")
                message = f"The upstream answered {response.status}: {error_message(text)}"
                if response.status in (408, 429) or response.status >= 500:
                    raise RetryableError("engine_unavailable", message)
                if "previous_response_not_found" in text:
                    raise RetryableError("engine_error", message, fresh=True)
                raise EngineError("engine_error", message)
            content = response.content
            lines = SSELineSplitter(self.config.max_message_bytes, "upstream")

            async def receive() -> list[str | bytes]:
                chunk = await content.readany()
                if not chunk:
                    message = "The upstream closed the stream before its terminal event."
                    raise broken_stream(message, streamed=turn.streamed)
                payloads = (sse_data(line) for line in lines.feed(chunk))
                return [data for data in payloads if data is not None and data != b"[DONE]"]

            async for event in self._relay(receive, turn, deadline):
                yield event
        except TimeoutError:
            raise self._timeout(turn) from None
        except aiohttp.ClientError as exc:
            message = f"The upstream at {self.http_url} failed: {exc or type(exc).__name__}."
            raise broken_stream(
                message, streamed=turn.streamed, code="engine_unavailable"
            ) from None
        finally:
            if response is not None:
                response.close()
