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

This module builds the request and runs the retries; ``completion_stream`` reads the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING

import orjson
import tiktoken
from bidi_responses.schema import JSONObject, JSONValue

from ..core.ports import EngineError, EngineEvent, EngineRequest
from ..engine_config import CompletionsConfig
from .completion_stream import StreamState, finish, read_completion
from .http_backend import (
    RetryableError,
    SessionPool,
    bearer_headers,
)
from .prompt_json import PromptJson

if TYPE_CHECKING:
    # Imported lazily below: the settings dataclass is part of the server config, which the
    # renderer's modules import in turn.
    from .formats import ChatFormat

__all__ = ["CompletionsEngine"]


class CompletionsEngine:
    """Streams completions from the backend named in ``config`` (see the module docstring)."""

    name = "completions"

    def __init__(
        self,
        config: CompletionsConfig,
        encoding: tiktoken.Encoding,
        open_compaction: Callable[[str], str] | None = None,
    ) -> None:
        if config.max_output_tokens < 1 or config.context_window < 2:
            raise ValueError("completions: max_output_tokens and context_window must be positive")
        from .format_choice import FORMATS, build_format

        if config.format not in FORMATS:
            raise ValueError(
                f"completions: unknown format {config.format!r}; expected {', '.join(FORMATS)}"
            )
        self.config = config
        settings = None
        if config.format == "template":
            from .template_format import TemplateSettings

            settings = TemplateSettings(
                config.tokenizer,
                config.chat_template,
                config.tool_call_format,
                config.chat_template_kwargs,
            )
        self.format: ChatFormat = build_format(config.format, encoding, open_compaction, settings)
        # The core renders this route's conversations with the model's own format.
        self.renderer = self.format.renderer
        self._url = config.base_url.rstrip("/") + "/completions"
        # The prompt ends where the model's turn begins (the renderer leaves it to the engine).
        self._assistant_start = self.format.assistant_start
        self._sessions = SessionPool(config.connect_timeout_s, config.max_connections)
        self._prompts = PromptJson()
        # Ids the backends' reports left out, worked out from the vocabulary (llama.cpp's
        # split characters) or tokenized back from text (no ids at all): see sampled_ids.
        self.recovered_ids = 0
        self.retokenized_tokens = 0
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def aclose(self, wait_s: float = 30.0) -> None:
        """Close the connection pool once the segments in flight are done (or ``wait_s``
        has passed: a stopping server does not wait for ever)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                await self._idle.wait()
        await self._sessions.aclose()

    def _body(
        self, request: EngineRequest, prompt: list[int], prompt_len: int | None = None
    ) -> JSONObject:
        """The request's body; ``prompt_len``: the prompt's length when ``prompt`` stands in
        for it (see ``_request_bytes``)."""
        config = self.config
        prompt_len = len(prompt) if prompt_len is None else prompt_len
        room = config.context_window - prompt_len
        if room < 1:
            raise EngineError(
                "context_length_exceeded",
                f"The conversation is {prompt_len} tokens; this model's context window is "
                f"{config.context_window}.",
            )
        budget = min(config.max_output_tokens, room)
        if request.max_output_tokens is not None:
            budget = min(budget, request.max_output_tokens)
        body: JSONObject = {
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
            "stop_token_ids": list(self.format.stop_token_ids),
            "skip_special_tokens": False,
        }
        if config.model:
            body["model"] = config.model
        fmt = request.response_format
        if fmt is not None and self.format.sends_response_format:
            body["response_format"] = _response_format(fmt)
        bias: JSONObject = {}
        if request.tool_choice == "none" and self.format.call_token is not None:
            # The model may not call a tool: it cannot open a call.
            bias[str(self.format.call_token)] = -100
        extra = config.extra_body
        body.update(extra)
        if bias:
            configured = extra.get("logit_bias")
            body["logit_bias"] = {**bias, **(configured if isinstance(configured, dict) else {})}
        return body

    def _request_bytes(
        self, body: JSONObject, placeholder: list[int], request: EngineRequest, tail: list[int]
    ) -> bytes:
        """``body`` as JSON with the prompt's ids in place of ``placeholder`` (its first key;
        an ``extra_body`` that sets its own prompt is sent as it is)."""
        data = orjson.dumps(body)
        head = b'{"prompt":[]'
        if body.get("prompt") is not placeholder or not data.startswith(head):
            return data
        return b'{"prompt":' + self._prompts.dumps(request.prompt_tokens, tail) + data[len(head) :]

    def _headers(self) -> dict[str, str]:
        return {
            "Accept": "text/event-stream",
            "Content-Type": "application/json",
            **bearer_headers(self.config.api_key_env, "backend"),
        }

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineEvent]:
        """Stream one segment from the backend (see the module docstring)."""
        config = self.config
        # The conversation's tokens, then where the model's turn begins (and a forced call's
        # header); the conversation's ids are written as JSON once (see ``prompt_json``).
        tail = list(self._assistant_start)
        parser = self.format.parser_for(request)
        opened: list[int] = []
        if request.forced_function:
            # A forced tool choice: the prompt opens the call, the model writes the arguments.
            opened = self.format.call_header(request.forced_function)
            tail += opened
        prompt_len = len(request.prompt_tokens) + len(tail)
        placeholder: list[int] = []
        body = self._request_bytes(
            self._body(request, placeholder, prompt_len), placeholder, request, tail
        )
        headers = self._headers()
        session = self._sessions.get()
        for token in opened:  # the parser reads the opened call as if the model had written it
            for event in parser.feed(token):
                yield event
        attempt = 0
        self._active += 1
        self._idle.clear()
        try:
            while True:
                state = StreamState(started=time.perf_counter(), vocabulary=self.format.vocabulary)
                try:
                    async for event in read_completion(
                        session,
                        self._url,
                        body,
                        headers,
                        parser,
                        state,
                        config,
                        request.merge_deltas,
                    ):
                        yield event
                    break
                except RetryableError as exc:
                    if state.tokens or attempt >= config.max_retries:
                        raise EngineError(exc.code, exc.message) from None
                    await asyncio.sleep(config.retry_backoff_s * 2**attempt)  # backoff
                    attempt += 1
        finally:
            self._active -= 1
            if not self._active:
                self._idle.set()
            self.recovered_ids += state.counts.recovered
            self.retokenized_tokens += state.counts.retokenized
        for event in parser.close():
            yield event
        yield finish(state, parser, prompt_len, attempt)


def _response_format(fmt: Mapping[str, JSONValue]) -> JSONObject:
    """A Responses ``text.format`` in the completions API's shape, the schema's keys in the
    client's order (a constrained decoder writes the properties in that order)."""
    if fmt.get("type") != "json_schema":
        return {"type": "json_object"}
    spec: JSONObject = {"name": fmt.get("name") or "response", "schema": fmt.get("schema") or {}}
    if fmt.get("strict") is not None:
        spec["strict"] = fmt.get("strict")
    return {"type": "json_schema", "json_schema": spec}
