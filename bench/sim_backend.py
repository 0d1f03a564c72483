"""The simulated engine in its own process, behind the token-level completions API.

vLLM, SGLang and the llama.cpp server take a prompt of token ids on ``POST /v1/completions``
and stream the sampled ids back as server-sent events. This process does the same for the
benchmark's simulated model, so that the server under test serves it through its production
``completions`` route (``format = "generic"``): rendering to ids, the request to a backend, a
streaming parse of the ids back into items. The engine's pacing then runs on this process's
event loop and CPU, not the API server's, as it does in a deployment.

The rollout and the timing are the in-process sim's own code (``engines.sim``,
``engines.timing``): the prompt is read back into what ``SimEngine`` decides from (the tools
in the rendered prefix, the tool rounds since the last user message, the model turns so far, a
forced call the prompt opened), ``SimEngine.plan`` picks the same output and ``play`` paces it
against this process's prefix cache (time to first token = base + uncached prompt tokens at the
prefill rate, then the decode rate). The format's own tokens (the header that opens an item,
``<|call|>`` or ``<|return|>`` that ends it) travel with the first and last content tokens and
are not charged decode time, so a turn costs the same engine time as on the in-process sim.

The sim's settings come with each request (the route's ``extra_body``: ``{"sim": {...}}``), so
one backend serves every server of a comparison; the prefix cache is the process's, shared by
every server and stream, as a deployment's inference server is. The reported ``timings``
(``prompt_ms``: the modeled time to first token, ``predicted_ms``: decoding) and
``usage.prompt_tokens_details.cached_tokens`` become the response's ``engine_ms`` and cached
tokens on the server, as with llama.cpp and vLLM.

Run: ``python -m bidi_responses.bench.sim_backend --port 8090`` (``--port 0`` picks one and
prints ``listening on http://127.0.0.1:PORT/v1``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields

import orjson
import tiktoken
from aiohttp import web
from bidi_responses.schema import JSONObject, JSONValue
from bidi_responses.server.core.ports import (
    Delta,
    EngineFinish,
    EngineRequest,
    FunctionSpec,
    ItemEnd,
    ItemStart,
)
from bidi_responses.server.core.rendering import tokenizer
from bidi_responses.server.core.rendering.tokenizer import load_encoding
from bidi_responses.server.engine_config import SimConfig
from bidi_responses.server.engines.prefix_cache import PrefixCache
from bidi_responses.server.engines.sim import SimEngine
from bidi_responses.server.engines.timing import play

__all__ = ["PromptFacts", "SimBackend", "main", "read_prompt", "sim_body"]

# A header is a role and a recipient; anything longer is not one the renderer wrote.
_MAX_HEADER_TOKENS = 128
#: SimConfig fields a request may set (``extra_body.sim``); the prefix cache is the process's.
_SIM_FIELDS = frozenset(f.name for f in fields(SimConfig) if not f.name.startswith("prefix_"))


def sim_body(config: SimConfig) -> JSONObject:
    """The ``extra_body`` of a completions route whose requests carry ``config``."""
    sim: JSONObject = {}
    for name in sorted(_SIM_FIELDS):
        value = getattr(config, name)
        if isinstance(value, int | float):
            sim[name] = value
    return {"sim": sim}


@dataclass(slots=True)
class PromptFacts:
    """What the in-process sim would be told about a prompt, read back from its tokens."""

    tools: tuple[FunctionSpec, ...] = ()
    response_format: JSONObject | None = None
    tool_rounds: int = 0
    model_turns: int = 0
    # The prompt ends inside a call header it opened (a forced tool choice).
    forced_function: str | None = None


def read_prompt(prompt: Sequence[int], encoding: tiktoken.Encoding) -> PromptFacts:
    """The facts of a prompt in the project's generic format (``core.rendering.render``).

    Only headers (and the first tokens of the prefix's developer blocks) are decoded: bodies
    are ordinary tokens, which never contain a special token, so blocks are found by searching
    for ``<|start|>`` at C speed however long the history is.
    """
    facts = PromptFacts()
    tools: list[FunctionSpec] = []
    n = len(prompt)
    starts: list[int] = []
    pos = 0
    while True:
        try:
            pos = prompt.index(tokenizer.START, pos)
        except ValueError:
            break
        starts.append(pos)
        pos += 1
    in_prefix = True
    last_model = False
    last_call = False
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else n
        header_end = min(end, start + 1 + _MAX_HEADER_TOKENS)
        message = _find(prompt, tokenizer.MESSAGE, start + 1, header_end)
        head = prompt[start + 1 : message if message >= 0 else header_end]
        channel_at = _find(head, tokenizer.CHANNEL, 0, len(head))
        role = encoding.decode(list(head[:channel_at] if channel_at >= 0 else head))
        channel = encoding.decode(list(head[channel_at + 1 :])) if channel_at >= 0 else ""
        closed = end > 0 and prompt[end - 1] in (tokenizer.END, tokenizer.CALL, tokenizer.RETURN)
        if i + 1 == len(starts) and not closed:
            # The open assistant turn the engine appended, possibly with a forced call header.
            if role.startswith("assistant to=functions.") and message >= 0:
                facts.forced_function = role.removeprefix("assistant to=functions.")
            break
        if in_prefix and message >= 0:
            if role == "system" and i == 0:
                continue
            if role == "developer":
                body = prompt[message + 1 : end - 1]
                lead = encoding.decode(list(body[:8]))
                if lead.startswith("# Tools\n") or lead.startswith("# Response Formats\n"):
                    text = encoding.decode(list(body))
                    kind, _, spec = text.partition("\n")
                    value = json.loads(spec)
                    if kind == "# Tools":
                        tools += _functions(value)
                    elif isinstance(value, dict):
                        facts.response_format = value
                    continue
        in_prefix = False
        # One conversation item: update the counts as ``core.conversation.state`` does.
        is_call = role.startswith("assistant to=functions.") and channel == "commentary json"
        is_model = role.startswith("assistant")
        if is_model and not last_model:
            facts.model_turns += 1
        if is_call and not last_call:
            facts.tool_rounds += 1
        elif role == "user":
            facts.tool_rounds = 0
        last_model, last_call = is_model, is_call
    facts.tools = tuple(tools)
    return facts


def _find(tokens: Sequence[int], token: int, lo: int, hi: int) -> int:
    try:
        return tokens.index(token, lo, hi)
    except ValueError:
        return -1


def _functions(value: JSONValue) -> list[FunctionSpec]:
    """The function tools of a rendered tool list (already canonical, as the engine sees it)."""
    out: list[FunctionSpec] = []
    if not isinstance(value, list):
        return out
    for tool in value:
        if isinstance(tool, dict) and tool.get("type") == "function":
            params = tool.get("parameters")
            out.append(
                FunctionSpec(
                    str(tool.get("name", "")),
                    params if isinstance(params, dict) else {"type": "object", "properties": {}},
                )
            )
    return out


class SimBackend:
    """The completions endpoint (see the module docstring)."""

    def __init__(self, encoding: tiktoken.Encoding | None = None) -> None:
        self.encoding = encoding if encoding is not None else load_encoding()
        defaults = SimConfig()
        self.prefix_cache = PrefixCache(
            block_tokens=defaults.prefix_block_tokens, max_blocks=defaults.prefix_cache_max_blocks
        )
        self._engines: dict[tuple[tuple[str, float], ...], SimEngine] = {}
        self._formats: dict[str, tuple[int, ...]] = {}
        self.requests = 0

    def engine(self, settings: JSONValue) -> SimEngine:
        """The sim of these settings (built once: it tokenizes its answer corpus)."""
        values = settings if isinstance(settings, dict) else {}
        chosen: dict[str, float] = {
            k: v
            for k, v in values.items()
            if k in _SIM_FIELDS and isinstance(v, int | float) and not isinstance(v, bool)
        }
        key = tuple(sorted(chosen.items()))
        engine = self._engines.get(key)
        if engine is None:
            config = SimConfig()
            for name, value in chosen.items():
                # Counts stay integers, rates floats, as the config file would give them.
                current = getattr(config, name)
                setattr(config, name, int(value) if isinstance(current, int) else float(value))
            config.__post_init__()
            engine = self._engines[key] = SimEngine(config, self.encoding)
        return engine

    def _tokens(self, text: str) -> tuple[int, ...]:
        tokens = self._formats.get(text)
        if tokens is None:
            tokens = self._formats[text] = tuple(self.encoding.encode_ordinary(text))
        return tokens

    def _opening(self, start: ItemStart) -> list[int]:
        """What the model writes after ``<|start|>assistant`` to open an item."""
        if start.kind == "function_call":
            return [
                *self._tokens(f" to=functions.{start.name}"),
                tokenizer.CHANNEL,
                *self._tokens("commentary json"),
                tokenizer.MESSAGE,
            ]
        return [tokenizer.CHANNEL, *self._tokens("final"), tokenizer.MESSAGE]

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/completions`` with ``stream: true`` and a token-id prompt."""
        loop = asyncio.get_running_loop()
        # The engine's clock starts at arrival: reading the prompt is part of its prefill.
        started = loop.time()
        body = orjson.loads(await request.read())
        prompt = body.get("prompt") if isinstance(body, dict) else None
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            return web.json_response(
                {"error": {"message": "prompt must be a list of token ids"}}, status=400
            )
        self.requests += 1
        engine = self.engine(body.get("sim"))
        facts = read_prompt(prompt, self.encoding)
        max_tokens = body.get("max_tokens")
        engine_request = EngineRequest(
            prompt_tokens=prompt,
            tools=facts.tools,
            forced_function=facts.forced_function,
            max_output_tokens=max_tokens if isinstance(max_tokens, int) else None,
            tool_rounds=facts.tool_rounds,
            turn_index=facts.model_turns,
            response_format=facts.response_format,
        )
        items, reason = engine.plan(engine_request)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        pending: list[int] = []
        kind = "message"
        with contextlib.suppress(ConnectionResetError):
            async for event in play(
                items,
                request=engine_request,
                timing=engine.timing,
                prefix_cache=self.prefix_cache,
                finish_reason=reason,
                start=started,
            ):
                if isinstance(event, ItemStart):
                    kind = event.kind
                    # A forced call's header is already in the prompt.
                    if not (kind == "function_call" and facts.forced_function):
                        pending = self._opening(event)
                elif isinstance(event, Delta):
                    await response.write(_chunk([*pending, *event.token_ids], event.text))
                    pending = []
                elif isinstance(event, ItemEnd):
                    if not event.incomplete:
                        end = tokenizer.CALL if kind == "function_call" else tokenizer.RETURN
                        await response.write(_chunk([end], ""))
                elif isinstance(event, EngineFinish):
                    await response.write(self._last(event, engine, len(prompt)))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        return response

    def _last(self, finish: EngineFinish, engine: SimEngine, prompt_tokens: int) -> bytes:
        cached = prompt_tokens - finish.prefill_tokens
        ttft_ms = engine.timing.ttft_seconds(finish.prefill_tokens) * 1000
        chunk: JSONObject = {
            "choices": [
                {
                    "index": 0,
                    "text": "",
                    "token_ids": [],
                    "finish_reason": "length" if finish.reason == "max_output_tokens" else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": finish.output_tokens,
                "total_tokens": prompt_tokens + finish.output_tokens,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
            # llama.cpp's shape: the server takes prompt_ms + predicted_ms as engine time.
            "timings": {
                "prompt_n": finish.prefill_tokens,
                "cache_n": cached,
                "prompt_ms": ttft_ms,
                "predicted_n": finish.output_tokens,
                "predicted_ms": finish.engine_seconds * 1000 - ttft_ms,
            },
        }
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "requests": self.requests})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/health", self.health)
        return app


def _chunk(token_ids: list[int], text: str) -> bytes:
    choice: JSONObject = {
        "index": 0,
        "text": text,
        "token_ids": list(token_ids),
        "finish_reason": None,
    }
    return b"data: " + orjson.dumps({"choices": [choice]}) + b"\n\n"


async def serve(host: str, port: int, app: web.Application | None = None) -> None:
    """Serve ``app`` (the sim backend's unless given) until SIGTERM or SIGINT; print the base
    URL once listening."""
    # A client that goes away cancels its handler, as vLLM aborts a request whose
    # connection closed.
    runner = web.AppRunner(app or SimBackend().app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = int(runner.addresses[0][1])
    print(f"listening on http://{host}:{bound}/v1", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
