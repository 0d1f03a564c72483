"""One streamed ``/v1/completions`` answer read into engine events.

``read_completion`` posts the request and reads its server-sent events under the first-token
and idle deadlines; each chunk's sampled token ids (vLLM's ``token_ids``, llama.cpp's
``logprobs.content[].id``, ``token_id:N`` logprob strings) go through the chat format's parser;
ids a report leaves out are worked out from the model's vocabulary (``sampled_ids``).
``StreamState`` keeps what the stream reported (tokens, usage, timings), from which
``finish`` builds the segment's ``EngineFinish``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import aiohttp
from bidi_responses.schema import JSONObject, JSONValue

from ..core.ports import Delta, EngineError, EngineEvent, EngineFinish
from .http_backend import (
    RetryableError,
    SSELineSplitter,
    broken_stream,
    decode_object,
    error_message,
    error_text,
    sse_data,
)
from .sampled_ids import IdCounts, Vocabulary, entry_ids

if TYPE_CHECKING:
    from ..engine_config import CompletionsConfig
    from .formats import CompletionParserLike

__all__ = ["MergedDeltas", "StreamState", "finish", "read_completion"]

_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# A single SSE line longer than this is not a completion chunk.
_MAX_LINE_BYTES = 1 << 20
# After the parser's stop token the stream is read on for the backend's usage report, unless
# the backend keeps sampling (it may not know the format's stop tokens): then it is cut off.
_MAX_TOKENS_AFTER_STOP = 8


@dataclass(slots=True)
class StreamState:
    """What one attempt's stream reported so far."""

    started: float
    last: float = 0.0
    tokens: int = 0
    after_stop: int = 0
    done: bool = False
    finish_reason: str | None = None
    usage: JSONObject = field(default_factory=dict)
    timings: JSONObject = field(default_factory=dict)
    # The model's vocabulary, for ids the backend does not report, and how many there were.
    vocabulary: Vocabulary | None = None
    counts: IdCounts = field(default_factory=IdCounts)

    def __post_init__(self) -> None:
        self.last = self.started


async def read_completion(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    parser: CompletionParserLike,
    state: StreamState,
    config: CompletionsConfig,
    merge_deltas: bool = True,
) -> AsyncIterator[EngineEvent]:
    """Post ``body`` (JSON, as ``headers`` say) to ``url`` and stream the parsed events;
    ``RetryableError`` while no token has arrived, ``EngineError`` otherwise."""
    loop = asyncio.get_running_loop()
    # Until the first token the deadline is the first-token timeout from the send; after
    # it, each chunk moves it to the idle timeout from that chunk. Only awaits are timed.
    deadline = loop.time() + config.first_token_timeout_s
    response: aiohttp.ClientResponse | None = None
    watch: _Watchdog | None = None
    try:
        async with asyncio.timeout_at(deadline):
            try:
                response = await session.post(url, data=body, headers=headers)
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
                raise RetryableError(
                    "engine_unavailable", f"The backend at {url} is unreachable: {exc}."
                ) from None
            await _check_status(response)
        reader = response.content
        lines = SSELineSplitter(_MAX_LINE_BYTES, "backend")
        merged = MergedDeltas(merge=merge_deltas)
        watch = _Watchdog(loop, deadline)
        while True:
            chunk = await watch.wait(reader.readany())
            if not chunk:
                break
            # The lines of one read are parsed together, and the deltas they hold travel on
            # as one: a backend streams a chunk per token, and each event handed on costs
            # the response's pipeline a step.
            try:
                for line in lines.feed(chunk):
                    _line(line, parser, state, merged)
                    if state.done or state.after_stop > _MAX_TOKENS_AFTER_STOP:
                        break
            except EngineError:
                for event in merged.take():  # what came before the bad line stays the output
                    yield event
                raise
            for event in merged.take():
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
                watch.deadline = loop.time() + config.idle_timeout_s
        if parser.finished or state.finish_reason:
            return  # complete, though the backend sent no [DONE]
        message = "The backend closed the stream before it finished the completion."
        raise broken_stream(message, streamed=bool(state.tokens))
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
        raise broken_stream(message, streamed=bool(state.tokens)) from None
    finally:
        if watch is not None:
            watch.close()
        if response is not None and not response.closed:
            # Closing (not releasing) a response that is still streaming drops the
            # connection: that is what tells the backend to abort the request.
            response.close()


class MergedDeltas:
    """Engine events with each run of consecutive deltas joined into one delta (up to
    ``max_chars`` of text; one delta longer than that stays whole); with ``merge`` off, every
    delta kept as it is."""

    __slots__ = ("_chars", "_events", "_merge", "_run", "max_chars")

    def __init__(self, max_chars: int = 1024, *, merge: bool = True) -> None:
        self.max_chars = max_chars
        self._merge = merge
        self._events: list[EngineEvent] = []
        self._run: list[Delta] = []
        self._chars = 0

    def extend(self, events: list[EngineEvent]) -> None:
        if not self._merge:
            self._events += events
            return
        for event in events:
            if isinstance(event, Delta):
                if self._run and self._chars >= self.max_chars:
                    self._flush()
                self._run.append(event)
                self._chars += len(event.text)
            else:
                self._flush()
                self._events.append(event)

    def take(self) -> list[EngineEvent]:
        """The events so far, in order; afterwards none are held."""
        self._flush()
        events, self._events = self._events, []
        return events

    def _flush(self) -> None:
        run = self._run
        if not run:
            return
        if len(run) == 1:
            self._events.append(run[0])  # a read of one token: the delta as it came
        else:
            text = "".join(d.text for d in run)
            self._events.append(Delta(text, tuple(i for d in run for i in d.token_ids)))
        self._run, self._chars = [], 0


class _Watchdog:
    """The reads of one stream timed against a deadline by one timer, not one per read.

    ``asyncio.timeout_at`` around each read schedules and cancels a timer handle per chunk,
    and a backend streams a chunk per token: at 4,000 tok/s that was a tenth of the event
    loop's work on the stream. Here a single timer is armed at the deadline; when it fires
    and the deadline has moved on (chunks came), it is armed again at the new one, so it
    is rescheduled once per idle period at most. Only time spent waiting in ``wait`` counts,
    as with a timeout around each read: a deadline passed while the reader was busy
    elsewhere expires the next wait that is still waiting when the timer fires.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        self.loop = loop
        self.deadline = deadline
        #: The task waiting in ``wait`` (None between reads).
        self.waiting: asyncio.Task[object] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._expired = False

    async def wait(self, read: Awaitable[bytes]) -> bytes:
        """``await read``, or TimeoutError once the deadline passes while it waits."""
        task = asyncio.current_task()
        assert task is not None
        if self._timer is None:
            self._timer = self.loop.call_at(self.deadline, self._fire)
        cancelling = task.cancelling()
        self.waiting = task
        try:
            return await read
        except asyncio.CancelledError:
            # Ours (not the caller's own cancellation): a timeout, as asyncio.timeout says it.
            if self._expired and task.uncancel() <= cancelling:
                raise TimeoutError from None
            raise
        finally:
            self.waiting = None

    def _fire(self) -> None:
        self._timer = None
        task = self.waiting
        if task is None:
            return  # between reads: the next wait arms it again
        if self.loop.time() >= self.deadline:
            self._expired = True
            task.cancel()
        else:
            self._timer = self.loop.call_at(self.deadline, self._fire)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def finish(
    state: StreamState, parser: CompletionParserLike, prompt_len: int, retries: int
) -> EngineFinish:
    """The segment's ``EngineFinish``: why it stopped and what the backend reported."""
    reason: Literal["stop", "tool_calls", "max_output_tokens"]
    if state.finish_reason == "length" and not parser.finished:
        reason = "max_output_tokens"
    elif parser.last_kind == "function_call":
        reason = "tool_calls"
    else:
        reason = "stop"
    usage = state.usage
    # The backend's own count when it reports one: ids tokenized back from text may not count
    # what was sampled, and llama.cpp reports no id for tokens it held back (the start of a
    # character) when the budget ends the completion.
    output_tokens = _int(usage.get("completion_tokens")) or state.tokens
    prompt_tokens = _int(usage.get("prompt_tokens")) or prompt_len
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    timings = state.timings
    if not cached:
        cached = _int(timings.get("cache_n"))
    wall = state.last - state.started
    backend_ms = _float(timings.get("prompt_ms")) + _float(timings.get("predicted_ms"))
    return EngineFinish(
        reason=reason,
        output_tokens=output_tokens,
        prefill_tokens=max(prompt_tokens - cached, 0),
        engine_seconds=backend_ms / 1000 if backend_ms > 0 else wall,
        extra={
            "backend_wall_ms": round(wall * 1000, 3),
            "retries": retries,
            "recovered_ids": state.counts.recovered,
            "retokenized_tokens": state.counts.retokenized,
        },
        prompt_tokens=prompt_tokens,
        cached_tokens=cached,
    )


async def _check_status(response: aiohttp.ClientResponse) -> None:
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
    message = error_message(text)
    if status in _RETRY_STATUS:
        raise RetryableError("engine_unavailable", f"The backend answered {status}: {message}")
    raise EngineError("engine_rejected_request", f"The backend answered {status}: {message}")


def _line(
    line: bytes, parser: CompletionParserLike, state: StreamState, events: MergedDeltas
) -> None:
    """Read one SSE line into ``state``; the events its tokens complete go to ``events``."""
    payload = sse_data(line)
    if payload is None:
        return
    if payload == b"[DONE]":
        state.done = True
        return
    chunk = decode_object(payload, "The backend sent a chunk")
    if "error" in chunk:
        raise EngineError(
            "engine_bad_response", f"The backend reported an error: {error_text(chunk)}"
        )
    state.last = time.perf_counter()
    if isinstance(chunk.get("usage"), dict):
        state.usage = chunk["usage"]
    if isinstance(chunk.get("timings"), dict):
        state.timings = chunk["timings"]
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        raise EngineError("engine_bad_response", "The backend sent a chunk without 'choices'.")
    for choice in choices:
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        ids = _token_ids(choice, state)
        if ids is None:
            text = choice.get("text")
            if text and isinstance(text, str) and state.vocabulary is not None:
                # No ids at all (a backend without logprobs): the text, tokenized back.
                ids = state.vocabulary.encode_text(text)
                state.counts.retokenized += len(ids)
            elif text:
                raise EngineError(
                    "engine_bad_response",
                    "The backend streamed text without its token ids; it must return them "
                    "(vLLM: return_token_ids, llama.cpp: logprobs).",
                )
            else:
                ids = []
        for token in ids:
            if parser.finished:
                state.after_stop += 1
                continue
            state.tokens += 1
            events.extend(parser.feed(token))
        if choice.get("finish_reason"):
            state.finish_reason = str(choice["finish_reason"])


def _token_ids(choice: JSONObject, state: StreamState) -> list[int] | None:
    ids = choice.get("token_ids")
    if isinstance(ids, list):
        return _checked(ids)
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict):
        content = logprobs.get("content")
        if isinstance(content, list) and content:
            return _checked(entry_ids(content, state.vocabulary, state.counts))
        tokens = logprobs.get("tokens")
        if (
            isinstance(tokens, list)
            and tokens
            and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens)
        ):
            return _checked([int(t[9:]) if t[9:].isdigit() else None for t in tokens])
    return None


def _checked(ids: list[JSONValue]) -> list[int]:
    checked: list[int] = []
    for i in ids:
        if not (isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1 << 31):
            raise EngineError("engine_bad_response", "The backend sent token ids that are not ids.")
        checked.append(i)
    return checked


def _int(value: JSONValue) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _float(value: JSONValue) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
