"""A real inference engine: token ids to an OpenAI-compatible ``/v1/completions`` backend.

vLLM, SGLang and the llama.cpp server all accept a prompt of token ids on their completions
endpoint. The engine sends the stream's rendered tokens as they are (plus the assistant start),
so the backend's own prefix (KV) cache sees the same prefix turn after turn and prefills only
the new tokens. It reads the sampled token ids back from the stream (vLLM: ``token_ids`` with
``return_token_ids``; llama.cpp: ``logprobs.content[].id``; ``token_id:N`` logprob strings)
and parses them into items with the chat format's parser (``completion_parser``).

Failure handling, as a production user expects of a proxy in front of inference:

* timeouts: connect, first token (queueing plus prefill) and the longest silence between two
  chunks; each ends the response with ``engine_timeout``;
* retries only while nothing was streamed (refused connection, 408/429/5xx, a connection
  dropped before the first token), with exponential backoff; never after a token;
* a backend that answers garbage (not SSE, not JSON, text without token ids, an error object,
  a stream cut short) gives ``engine_bad_response`` or ``engine_stream_broken``, and a 4xx
  gives ``engine_rejected_request`` with the backend's own message;
* cancel (client cancel or a client gone) closes the upstream connection, which is how
  vLLM, SGLang and llama.cpp learn to abort the request and free its slot.

Every such failure raises ``EngineError``; the core turns it into ``response.failed`` with the
code, keeps the stream open and writes the response's ledger row.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import aiohttp
import orjson
from bidi_responses.server.core import tokenizer
from bidi_responses.server.engines.base import (
    EngineError,
    EngineEvent,
    EngineFinish,
    EngineRequest,
)

if TYPE_CHECKING:
    # Imported lazily below: the settings dataclass is part of the server config, which the
    # renderer's modules import in turn.
    from bidi_responses.server.engines.formats import ChatFormat, CompletionParserLike

_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# A single SSE line longer than this is not a completion chunk.
_MAX_LINE_BYTES = 1 << 20
# After the parser's stop token the stream is read on for the backend's usage report, unless
# the backend keeps sampling (it may not know the format's stop tokens): then it is cut off.
_MAX_TOKENS_AFTER_STOP = 8


@dataclass(slots=True)
class CompletionsConfig:
    """One model route served by an OpenAI-compatible completions backend (TOML:
    ``[models.NAME.completions]``)."""

    # The backend's OpenAI base URL; the engine posts to ``{base_url}/completions``.
    base_url: str = "http://127.0.0.1:8080/v1"
    # The backend's model name; empty sends none (a backend serving one model uses it).
    model: str = ""
    # Environment variable holding the backend's API key (sent as a bearer token); empty: none.
    api_key_env: str = ""
    connect_timeout_s: float = 5.0
    # From sending the request to the first streamed chunk: queueing plus prefill.
    first_token_timeout_s: float = 120.0
    # The longest silence between two streamed chunks.
    idle_timeout_s: float = 30.0
    # Attempts after the first, only while no token has been streamed.
    max_retries: int = 2
    retry_backoff_s: float = 0.25
    # Most tokens one sampling segment may produce (the request's budget may lower it).
    max_output_tokens: int = 4096
    # The backend's context window: prompt plus output budget must fit.
    context_window: int = 131_072
    # Connections kept open to the backend.
    max_connections: int = 64
    # The model's chat format: "generic" (the project's own) or "harmony" (gpt-oss).
    format: str = "generic"
    # Extra fields merged into every request body (backend sampling settings, logit_bias...).
    extra_body: dict[str, Any] = field(default_factory=dict)


class CompletionsEngine:
    """Streams completions from the backend named in ``config`` (see the module docstring)."""

    name = "completions"

    def __init__(
        self,
        config: CompletionsConfig,
        encoding: Any,
        open_compaction: Callable[[str], str] | None = None,
    ) -> None:
        if config.max_output_tokens < 1 or config.context_window < 2:
            raise ValueError("completions: max_output_tokens and context_window must be positive")
        from bidi_responses.server.engines.formats import FORMATS, build_format

        if config.format not in FORMATS:
            raise ValueError(
                f"completions: unknown format {config.format!r}; expected {', '.join(FORMATS)}"
            )
        self.config = config
        self.format: ChatFormat = build_format(config.format, encoding, open_compaction)
        # The core renders this route's conversations with the model's own format.
        self.renderer = self.format.renderer
        self._url = config.base_url.rstrip("/") + "/completions"
        # The prompt ends where the model's turn begins (the renderer leaves it to the engine).
        self._assistant_start = self.format.assistant_start
        self._session: aiohttp.ClientSession | None = None
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def aclose(self, wait_s: float = 30.0) -> None:
        """Close the connection pool once the segments in flight are done (or ``wait_s``
        has passed: a stopping server does not wait for ever)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                await self._idle.wait()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            config = self.config
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=config.max_connections),
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=config.connect_timeout_s, sock_connect=None
                ),
                json_serialize=lambda value: orjson.dumps(value).decode(),
            )
        return self._session

    def _body(self, request: EngineRequest, prompt: list[int]) -> dict[str, Any]:
        config = self.config
        room = config.context_window - len(prompt)
        if room < 1:
            raise EngineError(
                "context_length_exceeded",
                f"The conversation is {len(prompt)} tokens; this model's context window is "
                f"{config.context_window}.",
            )
        budget = min(config.max_output_tokens, room)
        if request.max_output_tokens is not None:
            budget = min(budget, request.max_output_tokens)
        body: dict[str, Any] = {
            "prompt": prompt,
            "max_tokens": max(budget, 1),
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": request.temperature,
            "top_p": request.top_p,
            # How each backend returns sampled token ids: vLLM (return_token_ids), llama.cpp
            # (logprobs carry the id); stop_token_ids is understood by vLLM and SGLang.
            "return_token_ids": True,
            "logprobs": 1,
            "stop_token_ids": [tokenizer.RETURN, tokenizer.CALL],
            "skip_special_tokens": False,
        }
        if config.model:
            body["model"] = config.model
        body.update(config.extra_body)
        return body

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream"}
        env = self.config.api_key_env
        if env:
            key = os.environ.get(env)
            if not key:
                raise EngineError(
                    "engine_unavailable",
                    f"The backend's API key is missing: environment variable {env} is not set.",
                )
            headers["Authorization"] = f"Bearer {key}"
        return headers

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineEvent]:
        """Stream one segment from the backend (see the module docstring)."""
        config = self.config
        prompt = [*request.prompt_tokens, *self._assistant_start]
        parser = self.format.new_parser()
        opened: list[int] = []
        if request.forced_function:
            # A forced tool choice: the prompt opens the call, the model writes the arguments.
            opened = self.format.call_header(request.forced_function)
            prompt += opened
        body = self._body(request, prompt)
        headers = self._headers()
        session = self._client()
        for token in opened:  # the parser reads the opened call as if the model had written it
            for event in parser.feed(token):
                yield event
        attempt = 0
        self._active += 1
        self._idle.clear()
        try:
            while True:
                state = _StreamState(started=time.perf_counter())
                try:
                    async for event in self._stream(session, body, headers, parser, state):
                        yield event
                    break
                except _Retryable as exc:
                    if state.tokens or attempt >= config.max_retries:
                        raise EngineError(exc.code, exc.message) from None
                    await asyncio.sleep(config.retry_backoff_s * 2**attempt)  # backoff
                    attempt += 1
        finally:
            self._active -= 1
            if not self._active:
                self._idle.set()
        for event in parser.close():
            yield event
        reason: Literal["stop", "tool_calls", "max_output_tokens"]
        if state.finish_reason == "length" and not parser.finished:
            reason = "max_output_tokens"
        elif parser.last_kind == "function_call":
            reason = "tool_calls"
        else:
            reason = "stop"
        usage = state.usage
        prompt_tokens = _int(usage.get("prompt_tokens")) or len(prompt)
        details = usage.get("prompt_tokens_details")
        cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
        timings = state.timings
        if not cached:
            cached = _int(timings.get("cache_n"))
        wall = state.last - state.started
        backend_ms = _float(timings.get("prompt_ms")) + _float(timings.get("predicted_ms"))
        yield EngineFinish(
            reason=reason,
            output_tokens=state.tokens,
            prefill_tokens=max(prompt_tokens - cached, 0),
            engine_seconds=backend_ms / 1000 if backend_ms > 0 else wall,
            extra={"backend_wall_ms": round(wall * 1000, 3), "retries": attempt},
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
        )

    async def _stream(
        self,
        session: aiohttp.ClientSession,
        body: dict[str, Any],
        headers: dict[str, str],
        parser: CompletionParserLike,
        state: _StreamState,
    ) -> AsyncIterator[EngineEvent]:
        config = self.config
        loop = asyncio.get_running_loop()
        # Until the first token the deadline is the first-token timeout from the send; after
        # it, each chunk moves it to the idle timeout from that chunk. Only awaits are timed.
        deadline = loop.time() + config.first_token_timeout_s
        response: aiohttp.ClientResponse | None = None
        try:
            async with asyncio.timeout_at(deadline):
                try:
                    response = await session.post(self._url, json=body, headers=headers)
                except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
                    raise _Retryable(
                        "engine_unavailable", f"The backend at {self._url} is unreachable: {exc}."
                    ) from None
                await self._check_status(response)
            reader = response.content
            buffer = b""
            while True:
                async with asyncio.timeout_at(deadline):
                    chunk = await reader.readany()
                if not chunk:
                    break
                buffer += chunk
                if len(buffer) > _MAX_LINE_BYTES and b"\n" not in buffer:
                    raise EngineError(
                        "engine_bad_response",
                        f"The backend sent a line longer than {_MAX_LINE_BYTES} bytes.",
                    )
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    for event in self._line(line.strip(), parser, state):
                        yield event
                    if state.done:
                        # Read the end of the body so the connection can be kept alive.
                        async with asyncio.timeout(config.idle_timeout_s):
                            await reader.read()
                        response.release()
                        return
                    if state.after_stop > _MAX_TOKENS_AFTER_STOP:
                        return  # the backend samples on past a stop token: abort it
                if state.tokens:
                    deadline = loop.time() + config.idle_timeout_s
            if parser.finished or state.finish_reason:
                return  # complete, though the backend sent no [DONE]
            message = "The backend closed the stream before it finished the completion."
            if state.tokens:
                raise EngineError("engine_stream_broken", message)
            raise _Retryable("engine_stream_broken", message)
        except TimeoutError:
            if state.tokens:
                message = (
                    f"The backend went silent for more than {config.idle_timeout_s:g} s "
                    "mid-completion (idle_timeout_s)."
                )
            else:
                message = (
                    f"The backend sent no token within {config.first_token_timeout_s:g} s "
                    "(first_token_timeout_s)."
                )
            raise EngineError("engine_timeout", message) from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            message = f"The connection to the backend broke: {exc or type(exc).__name__}."
            if state.tokens:
                raise EngineError("engine_stream_broken", message) from None
            raise _Retryable("engine_stream_broken", message) from None
        finally:
            if response is not None and not response.closed:
                # Closing (not releasing) a response that is still streaming drops the
                # connection: that is what tells the backend to abort the request.
                response.close()

    async def _check_status(self, response: aiohttp.ClientResponse) -> None:
        status = response.status
        if status == 200:
            kind = response.headers.get("Content-Type", "")
            if "text/event-stream" not in kind:
                excerpt = (await response.content.read(300)).decode("utf-8", "replace")
                raise EngineError(
                    "engine_bad_response",
                    f"The backend answered {kind or 'no content type'} instead of an event "
                    f"stream: {excerpt!r}.",
                )
            return
        text = (await response.content.read(2000)).decode("utf-8", "replace")
        message = _error_message(text)
        if status in _RETRY_STATUS:
            raise _Retryable("engine_unavailable", f"The backend answered {status}: {message}")
        raise EngineError("engine_rejected_request", f"The backend answered {status}: {message}")

    def _line(
        self, line: bytes, parser: CompletionParserLike, state: _StreamState
    ) -> list[EngineEvent]:
        if not line or line.startswith(b":") or not line.startswith(b"data:"):
            return []  # blank line, comment, or another SSE field (event:, id:)
        payload = line[5:].strip()
        if payload == b"[DONE]":
            state.done = True
            return []
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise EngineError(
                "engine_bad_response",
                f"The backend sent a chunk that is not JSON: {payload[:120]!r}.",
            ) from None
        if not isinstance(chunk, dict):
            raise EngineError(
                "engine_bad_response", "The backend sent a chunk that is not an object."
            )
        if "error" in chunk:
            raise EngineError(
                "engine_bad_response", f"The backend reported an error: {_error_text(chunk)}"
            )
        state.last = time.perf_counter()
        if isinstance(chunk.get("usage"), dict):
            state.usage = chunk["usage"]
        if isinstance(chunk.get("timings"), dict):
            state.timings = chunk["timings"]
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            raise EngineError("engine_bad_response", "The backend sent a chunk without 'choices'.")
        events: list[EngineEvent] = []
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            ids = _token_ids(choice)
            if ids is None:
                if choice.get("text"):
                    raise EngineError(
                        "engine_bad_response",
                        "The backend streamed text without its token ids; it must return them "
                        "(vLLM: return_token_ids, llama.cpp: logprobs).",
                    )
                ids = []
            for token in ids:
                if parser.finished:
                    state.after_stop += 1
                    continue
                state.tokens += 1
                events += parser.feed(token)
            if choice.get("finish_reason"):
                state.finish_reason = str(choice["finish_reason"])
        return events


@dataclass(slots=True)
class _StreamState:
    started: float
    last: float = 0.0
    tokens: int = 0
    after_stop: int = 0
    done: bool = False
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.last = self.started


class _Retryable(Exception):
    """A failure before any token was streamed: the request may be sent again."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _token_ids(choice: dict[str, Any]) -> list[int] | None:
    ids = choice.get("token_ids")
    if isinstance(ids, list):
        return _checked(ids)
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict):
        content = logprobs.get("content")
        if isinstance(content, list) and content:
            return _checked(
                [entry.get("id") if isinstance(entry, dict) else None for entry in content]
            )
        tokens = logprobs.get("tokens")
        if (
            isinstance(tokens, list)
            and tokens
            and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens)
        ):
            return _checked([int(t[9:]) if t[9:].isdigit() else None for t in tokens])
    return None


def _checked(ids: list[Any]) -> list[int]:
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1 << 31 for i in ids):
        raise EngineError("engine_bad_response", "The backend sent token ids that are not ids.")
    return ids


def _error_message(text: str) -> str:
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text[:300].strip() or "(empty body)"
    return _error_text(data) if isinstance(data, dict) else text[:300]


def _error_text(data: dict[str, Any]) -> str:
    error = data.get("error", data)
    if isinstance(error, dict):
        return str(error.get("message") or error)[:500]
    return str(error)[:500]


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _float(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
