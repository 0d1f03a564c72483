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
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import orjson
from bidi_responses.server.core.items import Item
from bidi_responses.server.engines.base import (
    Delta,
    EngineAffinity,
    EngineError,
    EngineEvent,
    EngineFinish,
    EngineRequest,
    ItemEnd,
    ItemStart,
)
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

_TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete"})


@dataclass(slots=True)
class UpstreamConfig:
    """One model route served by an upstream Responses API (TOML: ``[models.NAME.upstream]``)."""

    # The upstream's OpenAI base URL: HTTP posts go to {base_url}/responses, WebSocket mode
    # connects to the same path with ws:// (wss:// for https://).
    base_url: str = "http://127.0.0.1:8000/v1"
    # The upstream model name (required by most upstreams).
    model: str = ""
    # Environment variable holding the upstream's API key (bearer token); empty: none.
    api_key_env: str = ""
    # "auto" (WebSocket mode, HTTP if the upgrade is refused), "websocket" or "http".
    transport: str = "auto"
    # Ask the upstream to store responses (then HTTP turns chain previous_response_id too).
    store: bool = False
    connect_timeout_s: float = 10.0
    first_event_timeout_s: float = 120.0
    idle_timeout_s: float = 60.0
    max_retries: int = 2
    retry_backoff_s: float = 0.25
    max_message_bytes: int = 64 * 1024 * 1024


@dataclass(slots=True)
class _LaneLink:
    """One lane's link to the upstream: its connection and where the upstream chain stands."""

    ws: ClientConnection | None = None
    http_only: bool = False
    upstream_id: str | None = None
    # The conversation the chain belongs to (the lane's item list) and how many of its items
    # the upstream already has.
    items: Sequence[Item] | None = None
    count: int = 0

    async def close(self) -> None:
        ws, self.ws = self.ws, None
        if ws is not None:
            await ws.close()


class _Retry(Exception):
    """Nothing was streamed yet: the turn may be sent again (``fresh``: without the chain)."""

    def __init__(self, code: str, message: str, *, fresh: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.fresh = fresh


@dataclass(slots=True)
class _Turn:
    started: float
    events: int = 0
    items: int = 0
    calls: int = 0
    kind: str | None = None
    # Whether the current item had deltas (some upstreams send only the finished item).
    had_delta: bool = False
    streamed: bool = False
    response: dict[str, Any] = field(default_factory=dict)
    terminal: str = ""


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
        base = config.base_url.rstrip("/")
        self._http_url = base + "/responses"
        self._ws_url = (
            "wss://" + base[len("https://") :]
            if base.startswith("https://")
            else "ws://" + base.removeprefix("http://")
        ) + "/responses"
        self._session: aiohttp.ClientSession | None = None
        self._key = f"upstream:{id(self)}"  # this engine's slot in a lane's affinity

    async def aclose(self) -> None:
        """Close the HTTP connection pool (lanes close their own WebSocket connections)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _headers(self) -> dict[str, str]:
        env = self.config.api_key_env
        if not env:
            return {}
        key = os.environ.get(env)
        if not key:
            raise EngineError(
                "engine_unavailable",
                f"The upstream's API key is missing: environment variable {env} is not set.",
            )
        return {"Authorization": f"Bearer {key}"}

    def _link(self, affinity: EngineAffinity) -> _LaneLink:
        link = affinity.values.get(self._key)
        if not isinstance(link, _LaneLink):
            link = _LaneLink(http_only=self.config.transport == "http")
            affinity.values[self._key] = link
            affinity.on_close(link.close)
        return link

    def _body(
        self, request: EngineRequest, items: Sequence[Item], previous: str | None
    ) -> dict[str, Any]:
        conversation = request.conversation
        assert conversation is not None
        body: dict[str, Any] = {
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
        headers = self._headers()
        link = self._link(conversation.affinity)
        items = conversation.items
        chained = link.items is items and link.upstream_id is not None and link.count <= len(items)
        attempt = 0
        while True:
            turn = _Turn(started=time.perf_counter())
            use_chain = chained and (not link.http_only or self.config.store)
            sent = items[link.count :] if use_chain else items
            body = self._body(request, sent, link.upstream_id if use_chain else None)
            try:
                if link.http_only:
                    stream = self._over_http(body, headers, turn)
                else:
                    stream = self._over_ws(link, body, headers, turn)
                async for event in stream:
                    yield event
                break
            except _Retry as exc:
                if turn.streamed or attempt >= self.config.max_retries:
                    link.upstream_id = None
                    link.items = None
                    raise EngineError(exc.code, exc.message) from None
                if exc.fresh:
                    chained = False
                await asyncio.sleep(self.config.retry_backoff_s * 2**attempt)  # backoff
                attempt += 1
            except BaseException:
                # Cancelled or failed mid-stream: the upstream may still be working on this
                # connection, and its chain no longer matches ours. Drop both.
                link.upstream_id = None
                link.items = None
                await link.close()
                raise
        response = turn.response
        link.upstream_id = str(response.get("id") or "") or None
        link.items = items
        link.count = len(items) + turn.items
        yield self._finish(turn)

    def _finish(self, turn: _Turn) -> EngineFinish:
        response = turn.response
        usage = response.get("usage") or {}
        details = usage.get("input_tokens_details") or {}
        stats = response.get("stats") or {}
        wall = time.perf_counter() - turn.started
        engine_ms = stats.get("engine_ms")
        reason: Literal["stop", "tool_calls", "max_output_tokens"] = "stop"
        incomplete = response.get("incomplete_details") or {}
        if turn.terminal == "response.incomplete" and incomplete.get("reason") in (
            "max_output_tokens",
            "max_tokens",
        ):
            reason = "max_output_tokens"
        elif turn.calls:
            reason = "tool_calls"
        prompt = int(usage.get("input_tokens") or 0)
        cached = int(details.get("cached_tokens") or 0)
        return EngineFinish(
            reason=reason,
            output_tokens=int(usage.get("output_tokens") or 0),
            prefill_tokens=max(prompt - cached, 0),
            engine_seconds=float(engine_ms) / 1000 if isinstance(engine_ms, int | float) else wall,
            extra={"upstream_response_id": response.get("id")},
            prompt_tokens=prompt,
            cached_tokens=cached,
        )

    # -- WebSocket mode ----------------------------------------------------------------------

    async def _open_ws(self, link: _LaneLink, headers: dict[str, str]) -> ClientConnection | None:
        config = self.config
        try:
            link.ws = await connect(
                self._ws_url,
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
            raise _Retry(
                "engine_unavailable", f"The upstream at {self._ws_url} is unreachable: {exc}."
            ) from None
        return link.ws

    async def _over_ws(
        self, link: _LaneLink, body: dict[str, Any], headers: dict[str, str], turn: _Turn
    ) -> AsyncIterator[EngineEvent]:
        ws = link.ws
        if ws is None:
            ws = await self._open_ws(link, headers)
            if ws is None:  # fell back to HTTP
                async for event in self._over_http(body, headers, turn):
                    yield event
                return
        config = self.config
        loop = asyncio.get_running_loop()
        deadline = loop.time() + config.first_event_timeout_s
        try:
            await ws.send(orjson.dumps({"type": "response.create", **body}).decode())
            while True:
                async with asyncio.timeout_at(deadline):
                    raw = await ws.recv()
                for event in self._event(_decode(raw), turn):
                    yield event
                if turn.terminal:
                    return
                if turn.streamed:
                    deadline = loop.time() + config.idle_timeout_s
        except TimeoutError:
            await link.close()
            limit = config.idle_timeout_s if turn.streamed else config.first_event_timeout_s
            raise EngineError(
                "engine_timeout", f"The upstream sent nothing for {limit:g} s."
            ) from None
        except ConnectionClosed as exc:
            link.ws = None
            message = f"The upstream closed the WebSocket connection ({exc})."
            if turn.streamed:
                raise EngineError("engine_stream_broken", message) from None
            raise _Retry("engine_stream_broken", message, fresh=True) from None

    # -- HTTP --------------------------------------------------------------------------------

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, connect=self.config.connect_timeout_s),
                json_serialize=lambda value: orjson.dumps(value).decode(),
            )
        return self._session

    async def _over_http(
        self, body: dict[str, Any], headers: dict[str, str], turn: _Turn
    ) -> AsyncIterator[EngineEvent]:
        config = self.config
        loop = asyncio.get_running_loop()
        deadline = loop.time() + config.first_event_timeout_s
        response: aiohttp.ClientResponse | None = None
        try:
            async with asyncio.timeout_at(deadline):
                response = await self._client().post(
                    self._http_url, json={**body, "stream": True}, headers=headers
                )
            if response.status != 200:
                text = (await response.content.read(2000)).decode("utf-8", "replace")
                message = f"The upstream answered {response.status}: {_error_message(text)}"
                if response.status in (408, 429) or response.status >= 500:
                    raise _Retry("engine_unavailable", message)
                if "previous_response_not_found" in text:
                    raise _Retry("engine_error", message, fresh=True)
                raise EngineError("engine_error", message)
            buffer = b""
            while not turn.terminal:
                async with asyncio.timeout_at(deadline):
                    chunk = await response.content.readany()
                if not chunk:
                    message = "The upstream closed the stream before its terminal event."
                    if turn.streamed:
                        raise EngineError("engine_stream_broken", message)
                    raise _Retry("engine_stream_broken", message)
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    line = line.strip()
                    if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                        continue
                    for event in self._event(_decode(line[5:]), turn):
                        yield event
                    if turn.terminal:
                        break
                if turn.streamed:
                    deadline = loop.time() + config.idle_timeout_s
        except TimeoutError:
            limit = config.idle_timeout_s if turn.streamed else config.first_event_timeout_s
            raise EngineError(
                "engine_timeout", f"The upstream sent nothing for {limit:g} s."
            ) from None
        except aiohttp.ClientError as exc:
            message = f"The upstream at {self._http_url} failed: {exc or type(exc).__name__}."
            if turn.streamed:
                raise EngineError("engine_stream_broken", message) from None
            raise _Retry("engine_unavailable", message) from None
        finally:
            if response is not None:
                response.close()

    # -- events ------------------------------------------------------------------------------

    def _event(self, event: dict[str, Any], turn: _Turn) -> list[EngineEvent]:
        """One upstream event as engine events; records the terminal response."""
        kind = event.get("type")
        turn.events += 1
        if kind == "error":
            nested = event.get("error")
            error: dict[str, Any] = nested if isinstance(nested, dict) else event
            code = str(error.get("code") or "")
            message = f"The upstream answered an error: {error.get('message') or code}"
            if code == "previous_response_not_found" and not turn.streamed:
                raise _Retry("engine_error", message, fresh=True)
            raise EngineError("engine_error", message)
        if kind in _TERMINAL:
            response = event.get("response")
            if not isinstance(response, dict):
                raise EngineError("engine_bad_response", f"The upstream's {kind} has no response.")
            if kind == "response.failed":
                error = response.get("error") or {}
                raise EngineError(
                    "engine_error",
                    f"The upstream response failed: {error.get('message') or error}",
                )
            turn.response = response
            turn.terminal = str(kind)
            return []
        if kind == "response.output_item.added":
            item = event.get("item") or {}
            item_kind = item.get("type")
            turn.streamed = True
            turn.had_delta = False
            if item_kind == "function_call":
                turn.kind = "function_call"
                return [
                    ItemStart(
                        "function_call",
                        name=str(item.get("name", "")),
                        call_id=str(item.get("call_id", "")),
                    )
                ]
            if item_kind == "message":
                turn.kind = "message"
                return [ItemStart("message")]
            if item_kind == "reasoning":
                turn.kind = "reasoning"
                return [ItemStart("reasoning")]
            turn.kind = None  # an item this engine does not relay (a hosted tool call)
            return []
        if kind in (
            "response.output_text.delta",
            "response.refusal.delta",
            "response.function_call_arguments.delta",
        ):
            delta = event.get("delta")
            if turn.kind in ("message", "function_call") and isinstance(delta, str) and delta:
                turn.had_delta = True
                return [Delta(delta, ())]
            return []
        if kind == "response.output_item.done":
            if turn.kind is None:
                return []
            item = event.get("item") or {}
            out: list[EngineEvent] = []
            if turn.kind == "reasoning":
                parts = item.get("summary") or item.get("content") or ()
                text = "\n".join(
                    str(part.get("text", "")) for part in parts if isinstance(part, dict)
                )
                if text:
                    out.append(Delta(text, ()))
            if not turn.had_delta and turn.kind == "function_call" and item.get("arguments"):
                out.append(Delta(str(item["arguments"]), ()))
            if not turn.had_delta and turn.kind == "message":
                text = "".join(
                    str(part.get("text") or part.get("refusal") or "")
                    for part in item.get("content") or ()
                    if isinstance(part, dict)
                )
                if text:
                    out.append(Delta(text, ()))
            if turn.kind == "function_call":
                turn.calls += 1
            turn.items += 1
            turn.kind = None
            out.append(ItemEnd())
            return out
        return []


def _decode(raw: str | bytes) -> dict[str, Any]:
    try:
        event = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise EngineError(
            "engine_bad_response", f"The upstream sent an event that is not JSON: {raw[:120]!r}."
        ) from None
    if not isinstance(event, dict):
        raise EngineError(
            "engine_bad_response", "The upstream sent an event that is not an object."
        )
    return event


def _error_message(text: str) -> str:
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text[:300].strip() or "(empty body)"
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error)[:500]
    return text[:300]
