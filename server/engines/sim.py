"""The simulated inference engine: realistic token streams on the benchmark's cost model.

It behaves like a tool-using model in an agent loop, which is what the benchmark replays: for
the first ``tool_rounds`` turns after a user message it calls one of the request's tools, with
argument JSON that is valid for the tool's schema and about ``function_call_tokens`` tokens
long; then it answers with about ``answer_tokens`` tokens of English-and-code text. Output is a
pure function of the config seed and the request's ``seed``, ``turn_index`` and
``tool_rounds`` (never wall time), so every transport replays the same rollout; only how it is
cut into Deltas depends on time (a late consumer gets what accumulated as one, see ``play``).

Timing and the engine's own prefix (KV) cache come from ``engines.timing``; the cache lives on
the engine instance, shared by every stream and transport. It models KV memory that a real
deployment holds in the inference server, yet its bookkeeping (one digest per block) lives in
this process: ``SimEngine.held_bytes`` says how much, so that memory figures can show it apart
from the API server's own state.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Mapping
from typing import Literal

import tiktoken
from bidi_responses.schema import JSONValue

from ..core.ports import (
    Delta,
    EngineEvent,
    EngineRequest,
    FunctionSpec,
    canonical_json,
    load_encoding,
)
from ..engine_config import SimConfig
from .prefix_cache import PrefixCache
from .schema_sampler import (
    FILLER_WORDS,
    SchemaSampler,
    schema_instance,
)
from .timing import (
    PlannedItem,
    play,
    token_deltas,
)

__all__ = ["PREFIX_BLOCK_BYTES", "SimEngine"]

#: Bytes of this process's heap that one remembered prefix block costs: its 16-byte digest
#: (a 49-byte ``bytes``) and its LRU entry. Measured with tracemalloc on CPython 3.11 (129 B
#: per block over 17,536 blocks); ``tests/engines/test_sim.py`` keeps it within 25%.
PREFIX_BLOCK_BYTES = 128


class SimEngine:
    """Simulated engine: tool calls valid for the tools' schemas, then a text answer.

    ``generate`` calls a tool when the request has tools, ``tool_choice`` is not ``"none"``,
    and either fewer than ``config.tool_rounds`` tool turns happened since the user's message,
    ``tool_choice`` is ``"required"``, or ``forced_function`` is set. The call's ``call_id`` is
    left empty for the core to assign. Otherwise it emits a message. ``max_output_tokens``
    truncates either (reason ``"max_output_tokens"``).
    """

    name: str = "sim"

    def __init__(
        self, config: SimConfig | None = None, encoding: tiktoken.Encoding | None = None
    ) -> None:
        self.config = config if config is not None else SimConfig()
        self.encoding = encoding if encoding is not None else load_encoding()
        self.timing = self.config.timing()
        self.prefix_cache = PrefixCache(
            block_tokens=self.config.prefix_block_tokens,
            max_blocks=self.config.prefix_cache_max_blocks,
        )
        # Tokenize the answer corpus once; answers are slices of it.
        self._corpus = token_deltas(self.encoding, self.encoding.encode_ordinary(_CORPUS))
        if any(len(delta.token_ids) != 1 for delta in self._corpus):
            raise AssertionError("the built-in corpus must be ASCII (one token per Delta)")
        # Answers start at a line start, so that they read like the start of a sentence or code.
        self._starts = [0] + [
            i + 1 for i, delta in enumerate(self._corpus[:-1]) if delta.text.endswith("\n")
        ]

    def held_bytes(self) -> int:
        """Bytes of this process's heap held by the simulated prefix cache (an estimate).

        At most ``prefix_cache_max_blocks * PREFIX_BLOCK_BYTES`` (about 8 MiB by default).
        """
        return len(self.prefix_cache) * PREFIX_BLOCK_BYTES

    def _rng(self, request: EngineRequest) -> random.Random:
        # A string seed is hashed with SHA-512 by random.Random: stable across processes and
        # independent of PYTHONHASHSEED.
        key = f"sim:{self.config.seed}:{request.seed}:{request.turn_index}:{request.tool_rounds}"
        return random.Random(key)

    def wants_tool_call(self, request: EngineRequest) -> bool:
        """Whether ``request`` gets a function call (rather than a text answer)."""
        if not request.tools or request.tool_choice == "none":
            return False
        return (
            request.tool_rounds < self.config.tool_rounds
            or request.tool_choice == "required"
            or request.forced_function is not None
        )

    def plan(
        self, request: EngineRequest
    ) -> tuple[list[PlannedItem], Literal["stop", "tool_calls"]]:
        """Decide the full output for ``request`` (before pacing and truncation)."""
        rng = self._rng(request)
        if self.wants_tool_call(request):
            tool = self._pick_tool(request, rng)
            arguments = self.arguments_for(tool.parameters, rng)
            deltas = token_deltas(self.encoding, self.encoding.encode_ordinary(arguments))
            return [PlannedItem(kind="function_call", name=tool.name, deltas=deltas)], "tool_calls"
        if request.response_format is not None:
            text = self.structured_answer(request.response_format, rng)
            deltas = token_deltas(self.encoding, self.encoding.encode_ordinary(text))
            return [PlannedItem(kind="message", deltas=deltas)], "stop"
        return [PlannedItem(kind="message", deltas=self._answer(rng))], "stop"

    def structured_answer(
        self, response_format: Mapping[str, JSONValue], rng: random.Random
    ) -> str:
        """A text answer that is JSON of the requested shape (structured outputs).

        ``json_schema``: an instance valid for the schema, as for tool arguments;
        ``json_object``: an object holding a short answer.
        """
        if response_format.get("type") == "json_schema":
            # Sampled from the canonical form: the same answer whatever order a transport
            # kept the schema's keys in (a gRPC Struct keeps none).
            schema = canonical_json(response_format.get("schema") or {})
            return _dumps(schema_instance(schema if isinstance(schema, dict) else {}, rng))
        words = " ".join(
            rng.choice(FILLER_WORDS) for _ in range(max(self.config.answer_tokens // 2, 1))
        )
        return _dumps({"answer": words})

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineEvent]:
        """Stream the output for ``request``; the last event is an EngineFinish."""
        # Planning counts as engine time: the pacing schedule starts before it.
        start = asyncio.get_running_loop().time()
        items, reason = self.plan(request)
        async for event in play(
            items,
            request=request,
            timing=self.timing,
            prefix_cache=self.prefix_cache,
            finish_reason=reason,
            start=start,
        ):
            yield event

    def arguments_for(self, parameters: Mapping[str, JSONValue], rng: random.Random) -> str:
        """Argument JSON valid for ``parameters``, padded toward ``function_call_tokens``.

        Padding appends words to one free-form string property (no enum, pattern or format),
        within its ``maxLength``; a schema without one yields its unpadded instance.
        """
        sampler = SchemaSampler(parameters, rng)
        value = sampler.sample(parameters)
        text = _dumps(value)
        target = self.config.function_call_tokens
        slots = sorted(sampler.pad_slots, key=lambda slot: slot.max_length is not None)
        count = len(self.encoding.encode_ordinary(text))
        # A few rounds suffice: each appended word is about one token.
        for _ in range(6):
            deficit = target - count
            if deficit <= 0 or not slots:
                break
            slot = slots[0]
            current = slot.get()
            words = " ".join(rng.choice(FILLER_WORDS) for _ in range(deficit))
            padded = f"{current} {words}" if current else words
            if slot.max_length is not None:
                padded = padded[: slot.max_length]
            if padded == current:
                slots.pop(0)  # this string is full; try the next one
                continue
            slot.set(padded)
            text = _dumps(value)
            count = len(self.encoding.encode_ordinary(text))
        return text

    def _pick_tool(self, request: EngineRequest, rng: random.Random) -> FunctionSpec:
        if request.forced_function is not None:
            for tool in request.tools:
                if tool.name == request.forced_function:
                    return tool
            raise ValueError(
                f"forced function {request.forced_function!r} is not among the request's tools"
            )
        return rng.choice(request.tools)

    def _answer(self, rng: random.Random) -> tuple[Delta, ...]:
        corpus = self._corpus
        offset = rng.choice(self._starts)
        wanted = self.config.answer_tokens
        # Slices, wrapping around the corpus when a long answer is asked for (a token at a time
        # cost ~1 ms per 2,000-token answer, all of it before the first token).
        answer = corpus[offset : offset + wanted]
        while len(answer) < wanted:
            answer += corpus[: wanted - len(answer)]
        return answer


def _dumps(value: JSONValue) -> str:
    # Compact separators, like models' tool-call output; ensure_ascii keeps every token a
    # whole character, so per-token Deltas concatenate to exactly this string.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True)


# The text the simulated model answers with: ASCII prose mixed with code and log lines, close
# to what an agent says at the end of a coding task. Answers are token slices of it.
_CORPUS = """\
I looked through the repository and ran the failing test locally. The problem is in the
request handler: it reads the whole history on every turn and re-encodes it, so the time per
turn grows with the length of the conversation. The fix keeps the rendered tokens per stream
and only encodes what is new.

Here is the change to `server/core/lanes/session.py`:

```python
class Session:
    def __init__(self, encoding, max_items: int = 10_000) -> None:
        self.encoding = encoding
        self.tokens: list[int] = []
        self.items: list[dict] = []
        self.max_items = max_items

    def append(self, item: dict) -> list[int]:
        if len(self.items) >= self.max_items:
            raise ValueError("conversation too long")
        new_tokens = render_item(self.encoding, item)
        self.items.append(item)
        self.tokens.extend(new_tokens)
        return new_tokens
```

After the change, the test suite passes:

```
$ python -m pytest -q tests/core
........................................................ [ 87%]
........                                                  [100%]
64 passed in 3.21s
```

The server log for a 25-turn rollout now looks like this:

```
2025-03-14 10:02:11,481 INFO  stream=7f3a turn=1 prompt_tokens=3112 cached=0 ttft_ms=81
2025-03-14 10:02:11,533 INFO  stream=7f3a turn=2 prompt_tokens=7204 cached=3072 ttft_ms=91
2025-03-14 10:02:11,590 INFO  stream=7f3a turn=3 prompt_tokens=11307 cached=7168 ttft_ms=92
2025-03-14 10:02:11,644 WARN  stream=7f3a slow tool output: 4096 tokens in 12 ms
2025-03-14 10:02:11,702 INFO  stream=7f3a turn=4 prompt_tokens=15391 cached=11264 ttft_ms=91
```

A few notes on the design. First, the cache is per stream, so two clients never see each
other's state, and closing the stream frees it. Second, the renderer is deterministic: the
same items always produce the same tokens, which is what lets the engine reuse its prefix
cache across turns. Third, a request that arrives without the stream's state (for example
after a reconnect) still works: it carries the full history and is rendered from scratch.

If you want to go further, the next step would be to move JSON parsing off the event loop
for very large tool outputs, and to add a metric for the number of tokens rendered per turn:

```python
def record_turn(metrics, session, rendered: int, elapsed: float) -> None:
    metrics.histogram("render.tokens", rendered)
    metrics.histogram("render.seconds", elapsed)
    if rendered > 0.5 * len(session.tokens):
        metrics.counter("render.full_history").inc()
```

Let me know if you would like me to open a pull request with these changes, or if there is
anything else to check before merging. I can also add a benchmark that compares the old and
the new code paths on a long rollout, with the results written to a JSON file.
"""
