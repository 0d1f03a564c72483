"""A stream's outbound queue: its events in order, bounded, with waiting deltas merged.

The session puts events here and the transport's writer takes them. When the writer falls
behind (a slow reader, a busy server, grpc.aio's per-message cost at many streams), the delta
events of one item pile up one per engine step; each would cost a message of its own. So a
delta put right behind a delta of the same item and content part that is still waiting is
merged into it: one event carrying both texts. Any client reads a larger delta (clients
concatenate deltas), on every transport, and the queue holds steps rather than tokens.

What a merged delta looks like: its ``delta`` is the concatenation, in order, and its
``sequence_number`` is that of the last delta merged into it. Sequence numbers therefore stay
strictly increasing, with a gap where deltas were merged, and resuming a response's events
``starting_after`` a merged delta's number continues right after the text it carried.
Nothing is merged across another event, another item, part, lane, or a delta already taken
by the writer, so order is kept and ``output_text.done`` equals the concatenated deltas.

A lane may also be *held* while more of the same step is known to follow without waiting for
the engine or the client: once an engine segment finished, the response's done events are
followed by its terminal event (or ``response.done``) as soon as post-inference made it
durable. A batching writer (``take``) then waits for that event before it takes a batch that
starts with the lane's events, so the step leaves in one message; other lanes' events are
never held back by it. The hold ends with the lane's next
terminal, ``response.done`` or ``error`` event, or when its run ends; never on a timer. And a
writer never waits for a held step while the queue is full: the step's own last event could
not be put then, and the stream would wedge with every producer waiting on the writer.
"""

from __future__ import annotations

from typing import cast

from bidi_responses.schema import ServerEvent

from ..process import LeanEvent, LeanQueue
from ..runs.record import OutEvent

# The delta events that may be merged, with the fields (besides the lane) that must match.
_MERGEABLE: dict[str, tuple[str, ...]] = {
    "response.output_text.delta": ("item_id", "output_index", "content_index"),
    "response.function_call_arguments.delta": ("item_id", "output_index"),
}


def merged(waiting: OutEvent, later: OutEvent, max_chars: int) -> OutEvent | None:
    """``waiting`` and ``later`` as one delta event, or None if they may not be merged
    (different kinds, items, parts or lanes, or the merged text would exceed ``max_chars``)."""
    first, second = waiting.data, later.data
    kind = first["type"]
    keys = _MERGEABLE.get(kind)
    if keys is None or second["type"] != kind or waiting.lane != later.lane:
        return None
    a, b = cast(dict[str, object], first), cast(dict[str, object], second)
    if any(a.get(key) != b.get(key) for key in keys):
        return None
    text_a, text_b = a["delta"], b["delta"]
    assert isinstance(text_a, str) and isinstance(text_b, str)
    if len(text_a) + len(text_b) > max_chars:
        return None
    # A new dict: the events themselves may be kept elsewhere (resumption) and stay as sent.
    data = dict(a, delta=text_a + text_b, sequence_number=b["sequence_number"])
    return OutEvent(waiting.lane, cast(ServerEvent, data))


# Events that end a held step.
_STEP_ENDS = frozenset(
    {
        "response.completed",
        "response.incomplete",
        "response.failed",
        "response.done",
        "error",
    }
)


class Outbox(LeanQueue[OutEvent | None]):
    """The outbound queue of one stream (``None`` ends it): an ``asyncio.Queue`` that merges a
    delta into the delta still waiting at its tail (see the module's docstring)."""

    def __init__(
        self, maxsize: int = 0, *, merge: bool = True, max_merged_chars: int = 65_536
    ) -> None:
        super().__init__(maxsize)
        self.merge = merge  # StreamingConfig.coalesce_deltas
        self.max_merged_chars = max_merged_chars
        #: Deltas merged into one waiting before them (each saved a message).
        self.merged = 0
        self._held: set[str] = set()
        self._changed = LeanEvent()  # set at every put and release, for a waiting writer

    def hold(self, lane: str) -> None:
        """More of ``lane``'s current step follows without waiting for the engine or the
        client (see the module's docstring)."""
        self._held.add(lane)

    def release(self, lane: str) -> None:
        """``lane``'s step is over (its run ended)."""
        if lane in self._held:
            self._held.discard(lane)
            self._changed.set()

    async def take(self, max_events: int) -> list[OutEvent | None]:
        """The next events, in order: waits for the first, then takes what is ready behind it
        (at most ``max_events``; a ``None`` ends the list). If the first event's lane is held,
        waits for the rest of its step first; a list of another lane's events stops before a
        held lane's, which go with the rest of their step next time."""
        first = await self.get()
        if first is None:
            return [None]
        batch: list[OutEvent | None] = [first]
        queue = self._queue
        while self._waits_for_step(first.lane):
            self._changed.clear()
            await self._changed.wait()
        held = self._held
        while len(batch) < max_events and queue:
            event = queue[0]
            if event is not None and event.lane != first.lane and event.lane in held:
                break
            batch.append(self.get_nowait())
            if event is None:
                break
        return batch

    def _waits_for_step(self, lane: str) -> bool:
        """Whether a writer holding ``lane``'s first event waits for the rest of its step.

        Never while the queue is full: the step's last event could then not be put, and the
        writer would wait for it forever (every producer waiting to put, nothing taken). A
        writer waits only while there is room, so whoever holds the step can always put.
        """
        queue = self._queue
        return lane in self._held and None not in queue and not self.full()

    def _put(self, item: OutEvent | None) -> None:
        queue = self._queue
        if self._held:
            if item is None or item.data["type"] in _STEP_ENDS:
                self._held.discard(item.lane if item is not None else "")
                if item is None:
                    self._held.clear()
            self._changed.set()
        if self.merge and item is not None and queue:
            tail = queue[-1]
            if tail is not None:
                both = merged(tail, item, self.max_merged_chars)
                if both is not None:
                    queue[-1] = both
                    self.merged += 1
                    return
        queue.append(item)
