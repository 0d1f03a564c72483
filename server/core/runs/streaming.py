"""Streaming one engine segment to the client: the engine's task, delta merging, and stops
at an output boundary.

The engine runs as its own task and hands its events over (``Handoff``); the consumer merges
text deltas that are already waiting (or arrive within the configured window) into one event,
and the ``ItemStreamer`` (``output_items``) turns the engine's item events into Responses
output events and items. A segment cut short (cancelled, disconnected, failed) keeps what was
generated, closed as ``incomplete``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TypeAlias

from bidi_responses.schema import JSONObject

from ...config import StreamingConfig
from ..api.requests import CreateRequest
from ..conversation.state import ConversationState
from ..ports import (
    Delta,
    Engine,
    EngineAffinity,
    EngineConversation,
    EngineEvent,
    EngineFinish,
    EngineRequest,
    ItemEnd,
    ItemStart,
)
from .handoff import Handoff
from .output_items import Emit, ItemStreamer


class _Failure:
    """An engine failure, handed to the consumer."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Wake:
    """Wakes the consumer when a stop is requested while it waits for the engine."""

    __slots__ = ()


_WAKE = _Wake()


#: What the engine task hands the consumer.
EngineOutput: TypeAlias = EngineEvent | _Failure | _Wake


class BoundaryStop:
    """A request to stop a response at its next safe output boundary (steering).

    Set from outside the response's task (``request``); the segment being streamed then stops
    once the output item in progress has ended, never inside one. Engine-agnostic: the
    consumer stops reading and the engine task is cancelled, which aborts its work (the
    completions engine closes its backend request, freeing the slot).
    """

    def __init__(self) -> None:
        self.requested = False
        self._outputs: Handoff[EngineOutput] | None = None

    def request(self) -> None:
        self.requested = True
        if self._outputs is not None:
            self._outputs.put(_WAKE)

    def clear(self) -> None:
        """The steering input was taken into this response: no stop any more."""
        self.requested = False

    def attach(self, outputs: Handoff[EngineOutput] | None) -> None:
        self._outputs = outputs


def engine_request_for(
    request: CreateRequest,
    state: ConversationState,
    budget: int | None,
    affinity: EngineAffinity,
    response_format: JSONObject | None,
    merge_deltas: bool = True,
) -> EngineRequest:
    """What the engine is asked for the next segment of ``request`` on ``state``
    (``response_format``: the request's ``output_format()``, taken once per response)."""
    choice = request.tool_choice
    return EngineRequest(
        prompt_tokens=state.tokens,
        tools=request.toolset.functions,
        tool_choice=choice if isinstance(choice, str) else "required",
        forced_function=choice["name"] if isinstance(choice, dict) else None,
        max_output_tokens=budget,
        parallel_tool_calls=request.parallel_tool_calls,
        tool_rounds=state.tool_rounds,
        turn_index=state.model_turns,
        response_format=response_format,
        temperature=request.temperature,
        top_p=request.top_p,
        conversation=EngineConversation(state.items, request.instructions, request.tools, affinity),
        merge_deltas=merge_deltas,
    )


async def stream_segment(
    engine: Engine,
    request: EngineRequest,
    streamer: ItemStreamer,
    config: StreamingConfig,
    stop: BoundaryStop | None = None,
) -> EngineFinish:
    """Run the engine on ``request`` and stream its events; returns its finish.

    With ``stop`` requested, the segment ends at the next output boundary: before its first
    item, at once; later, once no item is in progress, the next engine event decides. The
    engine's own finish means it was done anyway (returned as is); anything else (another
    item) is not streamed, and the finish has reason ``"steered"``. Deterministic for a
    deterministic engine: the outcome depends only on whether another item follows the one
    in progress.

    On any exception (cancellation included) the item being streamed is closed as
    ``incomplete`` with everything generated for it, ``streamer.tokens`` counts the segment's
    output, and the exception propagates. The engine task never outlives this call.
    """
    outputs: Handoff[EngineOutput] = Handoff()
    if stop is not None:
        stop.attach(outputs)

    async def produce() -> None:
        try:
            async for event in engine.generate(request):
                # Only what ends a run of deltas cuts a delta window short.
                outputs.put(event, urgent=not isinstance(event, Delta))
        except BaseException as exc:
            outputs.put(_Failure(exc))
            raise

    producer = asyncio.get_running_loop().create_task(produce())
    # Merged text not yet handed to the streamer: a cancelled response keeps it too.
    text, count = "", 0
    started = time.perf_counter()
    try:
        pending: EngineOutput | None = None
        produced = False  # an item of this segment has started
        while True:
            if stop is not None and stop.requested and streamer.current is None:
                if not produced:
                    # Nothing sampled yet in this segment: the boundary is now, and waiting
                    # for the engine's first item would only delay the successor.
                    finish = EngineFinish(
                        "steered", streamer.tokens, 0, time.perf_counter() - started
                    )
                else:
                    finish = await _boundary(outputs, pending, streamer, started)
                _step_follows(streamer.emit)
                return finish
            event = pending if pending is not None else await outputs.get()
            pending = None
            if isinstance(event, _Wake):
                continue
            if isinstance(event, Delta):
                text, count = event.text, len(event.token_ids)
                if config.coalesce_deltas:
                    # An item's first delta never waits, so the window costs no time to first
                    # token.
                    window = config.delta_window_ms if streamer.parts else 0.0
                    text, count, pending = await _merge(outputs, text, count, window, config)
                delta, delta_count, text, count = text, count, "", 0
                await streamer.delta(delta, delta_count)
            elif isinstance(event, ItemStart):
                produced = True
                await streamer.start(event)
            elif isinstance(event, ItemEnd):
                await streamer.end(incomplete=event.incomplete)
            elif isinstance(event, EngineFinish):
                _step_follows(streamer.emit)
                return event
            elif isinstance(event, _Failure):
                raise event.exc
    except BaseException:
        # Cancelled, cut off or failed mid-stream: the response keeps what was generated.
        if streamer.current is not None:
            text, count = _waiting_deltas(outputs, text, count)
        streamer.keep_partial(text, count)
        raise
    finally:
        if stop is not None:
            stop.attach(None)
        if not producer.done():
            producer.cancel()
        with contextlib.suppress(BaseException):  # already handed over as a _Failure
            await producer


def _step_follows(emit: Emit) -> None:
    """The segment is over: what follows (the terminal event or ``response.done``, after
    post-inference) waits for neither the engine nor the client, so a batching writer may wait
    for it and send the segment's last events with it (``Outbox.hold``)."""
    hold = getattr(emit, "hold", None)
    if hold is not None:
        hold()


async def _boundary(
    outputs: Handoff[EngineOutput],
    pending: EngineOutput | None,
    streamer: ItemStreamer,
    started: float,
) -> EngineFinish:
    """A stop was requested between items: the engine's finish if it comes next, otherwise a
    ``"steered"`` finish (what follows is dropped with the engine task)."""
    while True:
        event = pending if pending is not None else await outputs.get()
        pending = None
        if isinstance(event, _Wake):
            continue
        if isinstance(event, EngineFinish):
            return event
        if isinstance(event, _Failure):
            raise event.exc
        return EngineFinish("steered", streamer.tokens, 0, time.perf_counter() - started)


def _waiting_deltas(outputs: Handoff[EngineOutput], text: str, count: int) -> tuple[str, int]:
    """``text`` and ``count`` with the deltas already waiting after them (up to the first
    other event, which is dropped: the segment is over)."""
    while outputs:
        event = outputs.pop()
        if not isinstance(event, Delta):
            break
        text += event.text
        count += len(event.token_ids)
    return text, count


async def _merge(
    outputs: Handoff[EngineOutput],
    text: str,
    count: int,
    window_ms: float,
    config: StreamingConfig,
) -> tuple[str, int, EngineOutput | None]:
    """Merge the deltas already waiting (and, with a window, those arriving within it) into
    one: one message instead of several. Returns the text, its token count and the first
    non-delta event taken (None if none was).

    The window is one wait: for its end, or for an event that ends the run of deltas sooner.
    Deltas arriving meanwhile wait without waking this task, and are taken together after it.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + window_ms / 1000
    waited = window_ms <= 0
    while len(text) < config.max_delta_chars:
        if not outputs:
            if waited or loop.time() >= deadline:
                break
            await outputs.wait_urgent(deadline)
            waited = True
            continue
        nxt = outputs.pop()
        if not isinstance(nxt, Delta):
            return text, count, nxt
        text += nxt.text
        count += len(nxt.token_ids)
    return text, count, None
