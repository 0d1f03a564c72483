"""Pacing and the cost model shared by the simulated engines.

The cost model is the one the benchmarks run at ("The engine" in ``docs/results.md``):

* time to first token = a fixed base (``ttft_ms``) plus prefill of the *uncached* prompt tokens
  at ``prefill_tokens_per_second``;
* then output token ``k`` (1-based) is due ``k / tokens_per_second`` after that, so a segment of
  ``n`` output tokens costs ``ttft + n / tokens_per_second`` of engine time.

The engine keeps its own prefix cache (``prefix_cache``, like vLLM/SGLang automatic prefix
caching): prompt tokens that extend a token prefix it has already seen are not charged
prefill. That cache belongs to the engine instance and is shared by every stream and
transport, so that a stateless full-history request pays only the *API-side* cost of its
history. It is a different thing from the API layer's per-stream render cache and must never
be influenced by it.

``EngineFinish.engine_seconds`` reports the *modeled* time, not wall time: if the event loop is
late because the API layer is busy, that lateness shows up as API overhead (client-observed
time minus engine time), which is where it belongs.
"""

from __future__ import annotations

import asyncio
import codecs
import math
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from bidi_responses.schema import JSONValue

from ..core.ports import (
    Delta,
    EngineEvent,
    EngineFinish,
    EngineRequest,
    ItemEnd,
    ItemStart,
)
from ..engine_config import EngineTiming
from .prefix_cache import PrefixCache

__all__ = [
    "Pacer",
    "PlannedItem",
    "StepClock",
    "TokenDecoder",
    "play",
    "token_deltas",
]


# The resolution of asyncio's timers on Linux (epoll_wait takes whole milliseconds).
TIMER_GRANULARITY_S = 0.001


# The step of the shared clock (``StepClock``): the sleeps of every run that end within one
# step are released together, by one timer.
STEP_S = 0.00025


class StepClock:
    """The wake-ups of every simulated run on one event loop, one timer per step.

    A batched engine releases a token of every sequence at each decode step. A timer per run
    per token would cost the loop a timer handle and a heap push and pop for each token of
    each stream, and longer turns of the loop for everything else on it. Here a sleep joins
    the bucket of the step it ends in, and only a bucket's first sleeper sets a timer. The
    steps (``STEP_S``) are fine next to the loop's own millisecond rounding, so pacing is
    unchanged while the timers per millisecond fall from one per stream to a few.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._buckets: dict[int, list[asyncio.Future[None]]] = {}

    async def sleep(self, delay: float) -> None:
        """Wait ``delay`` seconds, released with every other sleep ending in the same step, at
        the step's end: never early, at most one step later than asked."""
        if delay <= 0:
            await asyncio.sleep(0)
            return
        step = math.ceil((self._loop.time() + delay) / STEP_S)
        waiter: asyncio.Future[None] = self._loop.create_future()
        bucket = self._buckets.get(step)
        if bucket is None:
            self._buckets[step] = [waiter]
            self._loop.call_at(step * STEP_S, self._release, step)
        else:
            bucket.append(waiter)
        await waiter

    def _release(self, step: int) -> None:
        for waiter in self._buckets.pop(step):
            if not waiter.done():  # a cancelled sleeper's waiter is cancelled
                waiter.set_result(None)

    @classmethod
    def of_running_loop(cls) -> StepClock:
        """The running loop's clock (one per loop, gone with it)."""
        loop = asyncio.get_running_loop()
        clock = _STEP_CLOCKS.get(loop)
        if clock is None:
            clock = _STEP_CLOCKS[loop] = cls(loop)
        return clock


_STEP_CLOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, StepClock] = (
    weakref.WeakKeyDictionary()
)


class Pacer:
    """Releases output tokens on the modeled schedule of one segment.

    Token ``k`` (1-based) is due at ``t0 + ttft + k / tokens_per_second``. ``advance`` sleeps
    only when the engine is ahead of that schedule; when the event loop was late, overdue
    tokens are released back to back, so the engine never falls further behind than the loop
    forces it to. To stay fair to other streams and responsive to cancellation, it still yields
    to the loop once every ``yield_every`` tokens released without sleeping.

    ``start`` (default: now, on ``clock``) is when the segment began; work the engine did
    before creating the pacer (planning, the prefix-cache lookup) then counts as part of the
    modeled time to first token instead of being added on top of it.
    """

    def __init__(
        self,
        timing: EngineTiming,
        uncached_prompt_tokens: int,
        *,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        yield_every: int = 64,
        start: float | None = None,
    ) -> None:
        self._timing = timing
        self._uncached = uncached_prompt_tokens
        # The loop's clock is the one asyncio.sleep keeps; tests may inject both.
        self._clock = clock if clock is not None else asyncio.get_running_loop().time
        self._sleep = sleep if sleep is not None else StepClock.of_running_loop().sleep
        # The loop's timers round up to its millisecond and the clock to its step; an
        # injected sleep is exact.
        self._early = (TIMER_GRANULARITY_S + STEP_S) / 2 if sleep is None else 0.0
        # Lateness within the timer's own rounding is the loop on time: tokens go one by one.
        self._slack = TIMER_GRANULARITY_S if sleep is None else 0.0
        self._t0 = start if start is not None else self._clock()
        self._ttft = timing.ttft_seconds(uncached_prompt_tokens)
        self._tps = timing.tokens_per_second
        self._yield_every = max(1, yield_every)
        self._emitted = 0
        self._unyielded = 0

    @property
    def tokens(self) -> int:
        """Output tokens released so far."""
        return self._emitted

    def modeled_seconds(self) -> float:
        """Modeled engine time so far: time to first token plus the released tokens."""
        return self._timing.modeled_seconds(self._uncached, self._emitted)

    def overdue(self) -> int:
        """Tokens past those released that have been due for longer than the timer's rounding:
        what the engine generated while its consumer was late."""
        elapsed = self._clock() - self._slack - self._t0 - self._ttft
        return max(0, math.floor(elapsed * self._tps + 1e-9) - self._emitted)

    async def advance(self, n: int = 1) -> None:
        """Wait until ``n`` more tokens are due (``n=0`` waits for the time to first token)."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        self._emitted += n
        due = self._t0 + self._ttft + self._emitted / self._tps
        # asyncio's selector rounds every wait up to a whole millisecond, so a sleep of exactly
        # ``delay`` wakes 0-1 ms late and the turn's last token would arrive ~0.5 ms after the
        # model says it is due: simulation lateness that would be measured as API overhead.
        # Aiming half the granularity (and half a ``StepClock`` step) early centres the release
        # on the schedule (±0.5 ms).
        delay = due - self._clock() - self._early
        if delay > 0:
            self._unyielded = 0
            await self._sleep(delay)
            return
        self._unyielded += n
        if self._unyielded >= self._yield_every:
            self._unyielded = 0
            await self._sleep(0)


class TokenDecoder(Protocol):
    """The part of ``tiktoken.Encoding`` needed to turn token ids into text."""

    def decode_single_token_bytes(self, token: int) -> bytes:
        """The bytes of one token."""
        ...


def token_deltas(encoding: TokenDecoder, token_ids: Iterable[int]) -> tuple[Delta, ...]:
    """Split ``token_ids`` into Deltas whose texts concatenate to the decoded text.

    Usually one token per Delta. A token that ends inside a multi-byte UTF-8 character is
    grouped with the following tokens until the character is complete, so no Delta ever carries
    half a character (tiktoken would decode it to U+FFFD).
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    deltas: list[Delta] = []
    pending: list[int] = []
    text = ""
    for token in token_ids:
        pending.append(token)
        text += decoder.decode(encoding.decode_single_token_bytes(token))
        buffered, _ = decoder.getstate()
        if not buffered:
            deltas.append(Delta(text=text, token_ids=tuple(pending)))
            pending = []
            text = ""
    if pending:
        text += decoder.decode(b"", final=True)
        deltas.append(Delta(text=text, token_ids=tuple(pending)))
    return tuple(deltas)


@dataclass(frozen=True, slots=True)
class PlannedItem:
    """One output item an engine has decided to produce, already tokenized into Deltas."""

    kind: Literal["message", "function_call"]
    deltas: tuple[Delta, ...]
    name: str = ""
    call_id: str = ""


#: Prompts at least this long are hashed for the prefix cache in a worker thread (about 5 ms
#: of hashing at this size; small prompts stay inline, with no thread hop).
OFFLOAD_PROMPT_TOKENS = 200_000


async def play(
    items: Sequence[PlannedItem],
    *,
    request: EngineRequest,
    timing: EngineTiming,
    prefix_cache: PrefixCache,
    finish_reason: Literal["stop", "tool_calls"],
    extra: Mapping[str, JSONValue] | None = None,
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], Awaitable[None]] | None = None,
    start: float | None = None,
) -> AsyncIterator[EngineEvent]:
    """Stream planned items as engine events, paced by ``timing``; ends with an EngineFinish.

    The prompt is looked up in (and added to) ``prefix_cache`` first, and only uncached tokens
    are charged prefill. Each ItemStart is released together with its item's first token; an
    item without tokens is released once the time to first token has passed.

    A consumer that comes back late gets everything of the item generated meanwhile as one
    Delta (texts and token ids joined), as a real engine's output collector hands over what
    accumulated while the API server was busy (vLLM merges a request's outputs until its reader
    takes them). On time, each planned Delta is its own event, and so is a token that fell due
    within the timer's rounding (1 ms); late beyond that, the work per event stays the same
    however far behind the loop is, instead of growing with the tokens owed.

    ``request.max_output_tokens`` caps the output: generation stops before the first Delta
    that does not fit (a multi-token Delta is never split, so the text stays valid), an item
    already started is closed with ItemEnd, and the reason is ``"max_output_tokens"``; the
    core must treat that last item as incomplete (its argument JSON may be cut short).

    ``clock`` and ``sleep`` default to the running loop's; tests inject fakes. ``start`` is
    when the segment began on that clock (default: now).

    The engine's own CPU work (hashing the prompt for the prefix cache: a few milliseconds at
    200k tokens) happens inside the modeled time to first token, not on top of it. A real
    engine does that work in its own process, so it must not surface as API overhead.

    Cancellation of the consuming task raises CancelledError at the next sleep, which
    propagates; nothing needs cleaning up.
    """
    clock = clock if clock is not None else asyncio.get_running_loop().time
    if start is None:
        start = clock()
    prompt = request.prompt_tokens
    if len(prompt) >= OFFLOAD_PROMPT_TOKENS:
        # A huge prompt's hashing would hold every other stream's turn for tens of ms.
        cached = await asyncio.to_thread(prefix_cache.match_and_insert, prompt)
    else:
        cached = prefix_cache.match_and_insert(prompt)
    uncached = len(prompt) - cached
    pacer = Pacer(timing, uncached, clock=clock, sleep=sleep, start=start)
    budget = request.max_output_tokens
    reason: Literal["stop", "tool_calls", "max_output_tokens"] = finish_reason

    for item in items:
        started = False
        truncated = False
        deltas = item.deltas
        index = 0
        while index < len(deltas):
            delta = deltas[index]
            n = len(delta.token_ids)
            if budget is not None and pacer.tokens + n > budget:
                truncated = True
                break
            await pacer.advance(n)
            index += 1
            if index < len(deltas):
                due = pacer.overdue()
                if budget is not None:
                    due = min(due, budget - pacer.tokens)
                late, tokens = _whole_deltas(deltas, index, due) if due > 0 else (0, 0)
                if late:
                    delta = _joined(deltas[index - 1 : index + late])
                    index += late
                    await pacer.advance(tokens)  # already due: no sleep
            if not started:
                started = True
                yield ItemStart(kind=item.kind, name=item.name, call_id=item.call_id)
            yield delta
        if truncated:
            if started:
                yield ItemEnd(incomplete=True)
            reason = "max_output_tokens"
            break
        if not started:
            await pacer.advance(0)
            yield ItemStart(kind=item.kind, name=item.name, call_id=item.call_id)
        yield ItemEnd()

    # Even a segment with no output tokens takes its time to first token.
    await pacer.advance(0)
    info: dict[str, JSONValue] = {"prompt_tokens": len(prompt), "cached_prompt_tokens": cached}
    if extra:
        info.update(extra)
    yield EngineFinish(
        reason=reason,
        output_tokens=pacer.tokens,
        prefill_tokens=uncached,
        engine_seconds=pacer.modeled_seconds(),
        extra=info,
    )


def _whole_deltas(deltas: Sequence[Delta], start: int, tokens: int) -> tuple[int, int]:
    """How many Deltas from ``start`` on fit wholly in ``tokens`` tokens, and their tokens."""
    end = start
    taken = 0
    while end < len(deltas):
        size = len(deltas[end].token_ids)
        if taken + size > tokens:
            break
        taken += size
        end += 1
    return end - start, taken


def _joined(deltas: Sequence[Delta]) -> Delta:
    """One Delta carrying ``deltas``' texts and token ids in order."""
    return Delta(
        text="".join(d.text for d in deltas),
        token_ids=tuple(token for d in deltas for token in d.token_ids),
    )
