"""An engine whose model is an upstream Responses API (hosted or self-hosted).

Each stream lane (a ``Connect`` stream, a WebSocket connection) keeps one upstream connection
in WebSocket mode and chains ``previous_response_id`` upstream, so the upstream's own
connection cache is used as well: a turn sends upstream only the items that are new since the
upstream's last response on that lane. The local stages (validation, classifiers, rendering,
the usage ledger) run as for any engine, on the new items only.

When the lane's chain breaks (another conversation on the lane, a continuation from an older
response, an upstream ``previous_response_not_found``, a lost connection) the engine sends the
whole conversation again, without ``previous_response_id``. The HTTP wire (``POST
/responses`` with ``stream: true``) is the fallback: used when the WebSocket upgrade is refused
(``transport = "auto"``) or configured (``"http"``); there a turn carries the whole
conversation unless the upstream stores responses (``store = true``).

Cancel closes the upstream WebSocket connection (the Responses WebSocket mode has no cancel
event), which stops the upstream's work; the lane's next turn opens a new connection. Upstream
failures become ``EngineError`` (``engine_unavailable``, ``engine_timeout``,
``engine_bad_response``, ``engine_stream_broken``, ``engine_error`` with the upstream's own
message), and retries happen only before anything was streamed.

This module keeps the lane's chain and the retries; ``upstream_wire`` speaks the two wires and
``upstream_events`` translates the upstream's events.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence

from bidi_responses.schema import JSONObject, JSONValue

from ..core.ports import (
    EngineAffinity,
    EngineError,
    EngineEvent,
    EngineRequest,
)
from ..engine_config import UpstreamConfig
from .http_backend import RetryableError, bearer_headers
from .upstream_events import UpstreamTurn, finish
from .upstream_wire import LaneLink, UpstreamWire

__all__ = ["UpstreamResponsesEngine"]


class UpstreamResponsesEngine:
    """Streams responses from an upstream Responses API (see the module docstring)."""

    name = "upstream"

    def __init__(self, config: UpstreamConfig) -> None:
        if config.transport not in ("auto", "websocket", "http"):
            raise ValueError(
                f"upstream: unknown transport {config.transport!r}; "
                "expected 'auto', 'websocket' or 'http'"
            )
        self.config = config
        self._wire = UpstreamWire(config)
        self._key = f"upstream:{id(self)}"  # this engine's slot in a lane's affinity

    async def aclose(self) -> None:
        """Close the HTTP connection pool (lanes close their own WebSocket connections)."""
        await self._wire.aclose()

    def _link(self, affinity: EngineAffinity) -> LaneLink:
        link = affinity.values.get(self._key)
        if not isinstance(link, LaneLink):
            link = LaneLink(http_only=self.config.transport == "http")
            affinity.values[self._key] = link
            affinity.on_close(link.close)
        return link

    def _body(
        self,
        request: EngineRequest,
        items: Sequence[Mapping[str, JSONValue]],
        previous: str | None,
    ) -> JSONObject:
        conversation = request.conversation
        assert conversation is not None
        body: JSONObject = {
            "model": self.config.model,
            "input": list(items),
            "store": self.config.store,
            "parallel_tool_calls": request.parallel_tool_calls,
            "temperature": request.temperature,
            "top_p": request.top_p,
        }
        if previous is not None:
            body["previous_response_id"] = previous
        if conversation.instructions:
            body["instructions"] = conversation.instructions
        if conversation.tools:
            body["tools"] = list(conversation.tools)
            body["tool_choice"] = (
                {"type": "function", "name": request.forced_function}
                if request.forced_function
                else request.tool_choice
            )
        if request.max_output_tokens is not None:
            body["max_output_tokens"] = max(request.max_output_tokens, 16)
        return body

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineEvent]:
        """One segment: the new items upstream, its streamed output back as engine events."""
        conversation = request.conversation
        if conversation is None:
            raise EngineError("engine_unavailable", "The upstream engine needs the items.")
        headers = bearer_headers(self.config.api_key_env, "upstream")
        link = self._link(conversation.affinity)
        items = conversation.items
        chained = link.items is items and link.upstream_id is not None and link.count <= len(items)
        attempt = 0
        while True:
            turn = UpstreamTurn(started=time.perf_counter())
            use_chain = chained and (not link.http_only or self.config.store)
            sent = items[link.count :] if use_chain else items
            body = self._body(request, sent, link.upstream_id if use_chain else None)
            try:
                async for event in self._wire.stream(link, body, headers, turn):
                    yield event
                break
            except RetryableError as exc:
                if turn.streamed or attempt >= self.config.max_retries:
                    link.forget_chain()
                    raise EngineError(exc.code, exc.message) from None
                if exc.fresh:
                    chained = False
                await asyncio.sleep(self.config.retry_backoff_s * 2**attempt)  # backoff
                attempt += 1
            except BaseException:
                # Cancelled or failed mid-stream: the upstream may still be working on this
                # connection, and its chain no longer matches ours. Drop both.
                link.forget_chain()
                await link.close()
                raise
        response = turn.response
        link.upstream_id = str(response.get("id") or "") or None
        link.items = items
        link.count = len(items) + turn.items
        yield finish(turn)
