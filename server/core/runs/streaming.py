"""Streaming one engine segment to the client: delta merging and the item streamer.

The engine runs as its own task and hands its events over (``Handoff``); the consumer merges
text deltas that are already waiting (or arrive within the configured window) into one event,
and the ``ItemStreamer`` turns the engine's item events into Responses output events and
items. A segment cut short (cancelled, disconnected, failed) keeps what was generated,
closed as ``incomplete``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeAlias

from bidi_responses.schema import (
    ContentPartAddedEvent,
    ContentPartDoneEvent,
    FunctionCallArgumentsDeltaEvent,
    FunctionCallArgumentsDoneEvent,
    Item,
    JSONObject,
    OutputItem,
    OutputItemAddedEvent,
    OutputItemDoneEvent,
    OutputTextDeltaEvent,
    OutputTextDoneEvent,
    OutputTextPart,
    ResponseEvent,
)

from ...config import StreamingConfig
from ..api.ids import new_id
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
from .record import EventSequence, ResponseRecord

Emit = Callable[[ResponseEvent], Awaitable[None]]


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
        streamer.keep_partial(text, count, outputs)
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


class ItemStreamer:
    """Turns engine item events into Responses output events and items."""

    def __init__(
        self,
        emit: Emit,
        seq: EventSequence,
        record: ResponseRecord,
        on_first_delta: Callable[[], None],
    ) -> None:
        self.emit = emit
        self.seq = seq
        self.record = record
        self.on_first_delta = on_first_delta
        self.items: list[Item] = []
        self.current: OutputItem | None = None
        self.index = 0
        self.parts: list[str] = []
        # Output tokens handed to the client so far (the engine's count is authoritative when
        # the segment finishes; this one is what a cut-short segment is charged).
        self.tokens = 0

    async def start(self, event: ItemStart) -> None:
        self.parts = []
        self.index = len(self.record.output)
        item: OutputItem
        if event.kind == "message":
            item = {
                "type": "message",
                "id": new_id("msg"),
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
        elif event.kind == "reasoning":
            # Reasoning is shown whole when it ends (the wire has no reasoning deltas).
            item = {"type": "reasoning", "id": new_id("rs"), "summary": []}
        else:
            item = {
                "type": "function_call",
                "id": new_id("fc"),
                "call_id": event.call_id or new_id("call"),
                "name": event.name,
                "arguments": "",
                "status": "in_progress",
            }
        self.current = item
        self.record.output.append(item)
        await self.emit(
            OutputItemAddedEvent(
                type="response.output_item.added",
                output_index=self.index,
                item=_copy_item(item),
                sequence_number=self.seq.take(),
            )
        )
        if item["type"] == "message":
            await self.emit(
                ContentPartAddedEvent(
                    type="response.content_part.added",
                    item_id=item["id"],
                    output_index=self.index,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []},
                    sequence_number=self.seq.take(),
                )
            )

    async def delta(self, text: str, tokens: int) -> None:
        item = self.current
        assert item is not None
        self.on_first_delta()
        self.parts.append(text)
        self.tokens += tokens
        if item["type"] == "reasoning":
            return
        if item["type"] == "message":
            await self.emit(
                OutputTextDeltaEvent(
                    type="response.output_text.delta",
                    item_id=item["id"],
                    output_index=self.index,
                    content_index=0,
                    delta=text,
                    sequence_number=self.seq.take(),
                )
            )
        else:
            await self.emit(
                FunctionCallArgumentsDeltaEvent(
                    type="response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=self.index,
                    delta=text,
                    sequence_number=self.seq.take(),
                )
            )

    def keep_partial(self, text: str, tokens: int, outputs: Handoff[EngineOutput]) -> None:
        """Close the item being streamed as ``incomplete`` with everything generated for it
        (merged but unsent text, and deltas still waiting), counted in ``tokens``."""
        if self.current is not None:
            while outputs:
                event = outputs.pop()
                if not isinstance(event, Delta):
                    break
                text += event.text
                tokens += len(event.token_ids)
            self.parts.append(text)
            self.tokens += tokens
            self._close(self.current, "".join(self.parts))
            self.current["status"] = "incomplete"
            self.current = None

    @staticmethod
    def _close(item: OutputItem, text: str) -> OutputTextPart | None:
        """Put the item's final text in place; returns the message's content part."""
        if item["type"] == "reasoning":
            item["summary"] = [{"type": "summary_text", "text": text}]
            return None
        if item["type"] == "message":
            part: OutputTextPart = {"type": "output_text", "text": text, "annotations": []}
            item["content"] = [part]
            return part
        item["arguments"] = text
        return None

    async def end(self, *, incomplete: bool = False) -> None:
        item = self.current
        assert item is not None
        text = "".join(self.parts)
        part = self._close(item, text)
        if part is not None:
            await self.emit(
                OutputTextDoneEvent(
                    type="response.output_text.done",
                    item_id=item["id"],
                    output_index=self.index,
                    content_index=0,
                    text=text,
                    sequence_number=self.seq.take(),
                )
            )
            await self.emit(
                ContentPartDoneEvent(
                    type="response.content_part.done",
                    item_id=item["id"],
                    output_index=self.index,
                    content_index=0,
                    part=part,
                    sequence_number=self.seq.take(),
                )
            )
        elif item["type"] == "function_call":
            await self.emit(
                FunctionCallArgumentsDoneEvent(
                    type="response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=self.index,
                    arguments=text,
                    name=item["name"],
                    sequence_number=self.seq.take(),
                )
            )
        # A message cut short by max_output_tokens is incomplete, as the hosted API marks it.
        item["status"] = "incomplete" if incomplete else "completed"
        await self.emit(
            OutputItemDoneEvent(
                type="response.output_item.done",
                output_index=self.index,
                item=item,
                sequence_number=self.seq.take(),
            )
        )
        self.items.append(item)
        self.current = None


def _copy_item(item: OutputItem) -> OutputItem:
    """The item as it is announced: later changes to the streamed item do not show in it."""
    copy = item.copy()
    if copy["type"] == "message":
        copy["content"] = list(copy["content"])
    return copy
