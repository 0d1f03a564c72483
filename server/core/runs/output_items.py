"""The items of a response as they stream: engine item events become Responses output events.

An ``ItemStreamer`` opens an output item when the engine starts one, sends its deltas (text
and function-call arguments; reasoning is shown whole when it ends), and closes it with its
final text. A segment cut short closes the item in progress as ``incomplete``, keeping what
was generated for it (``keep_partial``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from bidi_responses.schema import (
    ContentPartAddedEvent,
    ContentPartDoneEvent,
    FunctionCallArgumentsDeltaEvent,
    FunctionCallArgumentsDoneEvent,
    Item,
    OutputItem,
    OutputItemAddedEvent,
    OutputItemDoneEvent,
    OutputTextDeltaEvent,
    OutputTextDoneEvent,
    OutputTextPart,
    ResponseEvent,
)

from ..api.ids import new_id
from ..ports import ItemStart
from .record import EventSequence, ResponseRecord

#: Sends one of a response's events to its client.
Emit = Callable[[ResponseEvent], Awaitable[None]]


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

    def keep_partial(self, text: str, tokens: int) -> None:
        """Close the item being streamed as ``incomplete`` with everything generated for it
        (``text``: what the engine sent after the last delta streamed), counted in
        ``tokens``."""
        if self.current is not None:
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
