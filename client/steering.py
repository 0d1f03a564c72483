"""What a stream knows about its steers, kept apart from I/O: the acknowledgement each
``steer()`` awaits, the accepted steers not yet committed, and the automatic successors.

The stream's reader hands every message to ``Steering.route`` before anything else sees it.
An acknowledgement resolves the oldest ``steer()`` waiting on its target. A successor (a
``response.created`` whose ``previous_response_id`` is a target with accepted steers) and
every event of the lane while it runs go to that successor's own queue, so the lane's next
create never reads them as its own; ``ConnectStream.follow`` reads that queue.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from bidi_responses.codec import EventDecoder
from bidi_responses.v1 import responses_pb2 as pb

from .types import JSONObject, ResponsesError, SteerAck

#: Targets whose successor (or its absence) is remembered for a later ``follow``.
MAX_REMEMBERED = 64

# Where a successor's messages go; None after them ends the iteration of a stream that ended.
SuccessorQueue = asyncio.Queue["pb.ConnectResponse | None"]
_SNAPSHOTS = frozenset(
    {
        "response_created",
        "response_queued",
        "response_in_progress",
        "response_completed",
        "response_failed",
        "response_incomplete",
        "response_done",
    }
)
_TERMINALS = frozenset({"response_completed", "response_failed", "response_incomplete"})
_ACKS = frozenset({"response_steer_accepted", "response_steer_failed", "response_steer_pending"})
# Refusals saying that the target runs no longer (or never ran) on this stream.
_NOT_STEERABLE = frozenset(
    {"response_not_found", "response_already_completed", "response_not_active"}
)
#: Where ``Steering.route`` sends a message: the lane's own queue, nowhere (an
#: acknowledgement, consumed), or the queue of the successor running on the lane.
Route: TypeAlias = Literal["lane", "consumed"] | SuccessorQueue


@dataclass(slots=True)
class _Target:
    """One steered response: steers awaiting their answer, accepted steers not yet
    committed, whether it ended, and what follows it."""

    waiting: deque[asyncio.Future[SteerAck]] = field(default_factory=deque)
    accepted: set[str] = field(default_factory=set)
    ended: bool = False
    # The successor's queue, or None when none will come; set once.
    follows: asyncio.Future[SuccessorQueue | None] | None = None
    # The steer.failed / steer.pending event that ended the last accepted steer.
    last_outcome: JSONObject | None = None


class Steering:
    """The steering state of one stream (used by its reader task only, plus ``expect`` and
    ``successor`` from the callers)."""

    def __init__(self) -> None:
        self._targets: OrderedDict[str, _Target] = OrderedDict()
        # Responses seen ending lately: a steer sent after its target ended finds it ended.
        self._ended_lately: OrderedDict[str, None] = OrderedDict()
        # Per lane: the successor running there and its queue.
        self._running: dict[str, tuple[str, SuccessorQueue]] = {}
        self._decoder = EventDecoder()

    def _target(self, response_id: str) -> _Target:
        target = self._targets.get(response_id)
        if target is None:
            target = self._targets[response_id] = _Target(ended=response_id in self._ended_lately)
            while len(self._targets) > MAX_REMEMBERED:
                oldest = next(iter(self._targets))
                if self._targets[oldest].waiting:  # still answering a steer(): keep it
                    break
                del self._targets[oldest]
        return target

    # -- the callers' side ----------------------------------------------------------------------

    def expect(self, previous_response_id: str) -> asyncio.Future[SteerAck]:
        """The acknowledgement of a steer about to be sent on ``previous_response_id``."""
        future: asyncio.Future[SteerAck] = asyncio.get_running_loop().create_future()
        self._target(previous_response_id).waiting.append(future)
        return future

    def forget(self, previous_response_id: str, future: asyncio.Future[SteerAck]) -> None:
        """A steer that could not be sent: nothing will answer it."""
        target = self._targets.get(previous_response_id)
        if target is not None and future in target.waiting:
            target.waiting.remove(future)

    def successor(self, previous_response_id: str) -> asyncio.Future[SuccessorQueue | None]:
        """Resolves to the queue of ``previous_response_id``'s successor once it starts, or to
        None once none can come (see ``outcome``): at once for a response this client never
        steered (only its own steers' successors are kept apart)."""
        target = self._targets.get(previous_response_id)
        if target is None:
            nothing: asyncio.Future[SuccessorQueue | None] = (
                asyncio.get_running_loop().create_future()
            )
            nothing.set_result(None)
            return nothing
        if target.follows is None:
            target.follows = asyncio.get_running_loop().create_future()
            self._settle(target)
        return target.follows

    def outcome(self, previous_response_id: str) -> JSONObject | None:
        """The event that left ``previous_response_id`` without a successor, if any."""
        target = self._targets.get(previous_response_id)
        return target.last_outcome if target is not None else None

    # -- the reader's side ----------------------------------------------------------------------

    def route(self, message: pb.ConnectResponse) -> Route:
        """Note what ``message`` says and where it goes. Acknowledgements are consumed here:
        ``steer()`` returns them, and no lane or successor queue sees them."""
        case = message.WhichOneof("event")
        lane = message.stream_id
        if case in _ACKS:
            return "consumed" if self._acknowledge(self._decoder.event(message)) else "lane"
        running = self._running.get(lane)
        if case in _SNAPSHOTS:
            response = getattr(message, case).response
            if running is not None and response.id == running[0]:
                if case in _TERMINALS:
                    del self._running[lane]
                    self._ended(response.id)
                return running[1]
            if case == "response_created":
                return self._created(lane, response)
            if case in _TERMINALS:
                self._ended(response.id)
            return "lane"
        if running is not None and case != "error":
            return running[1]  # a delta or item event of the successor running on this lane
        return "lane"

    def _created(self, lane: str, response: pb.Response) -> Route:
        previous = response.previous_response_id
        target = self._targets.get(previous) if previous else None
        if target is None or not target.accepted:
            return "lane"
        # The commit point of every steer accepted on the target.
        target.accepted.clear()
        queue: SuccessorQueue = asyncio.Queue()
        self._running[lane] = (response.id, queue)
        if target.follows is None:
            target.follows = asyncio.get_running_loop().create_future()
        if not target.follows.done():
            target.follows.set_result(queue)
        return queue

    def _ended(self, response_id: str) -> None:
        self._ended_lately[response_id] = None
        if len(self._ended_lately) > 4 * MAX_REMEMBERED:
            self._ended_lately.popitem(last=False)
        target = self._targets.get(response_id)
        if target is not None:
            target.ended = True
            self._settle(target)

    def _acknowledge(self, event: JSONObject) -> bool:
        """Apply an acknowledgement; False when it answers no ``steer()`` of this client (a
        steer sent raw with ``send``), which then goes to its lane like any event."""
        steer = event["steer"]
        previous = steer["previous_response_id"]
        target = self._targets.get(previous)
        steer_id = steer.get("id")
        kind = event["type"]
        if target is None:
            return False
        if steer_id is not None and steer_id in target.accepted:
            # Accepted, then returned or left pending: no successor for this steer.
            target.accepted.discard(steer_id)
            target.last_outcome = event
        elif kind == "response.steer.pending" or not target.waiting:
            return False
        else:
            target.waiting.popleft().set_result(SteerAck.from_event(event))
            if kind == "response.steer.accepted":
                target.accepted.add(steer_id)
            elif event["error"].get("code") in _NOT_STEERABLE:
                target.ended = True  # nothing runs there any more (or never did)
        self._settle(target)
        return True

    def _settle(self, target: _Target) -> None:
        """Resolve ``follows`` to None once no successor can come: the target ended and no
        steer of it is awaiting its answer or accepted and uncommitted."""
        if (
            target.follows is not None
            and not target.follows.done()
            and target.ended
            and not target.waiting
            and not target.accepted
        ):
            target.follows.set_result(None)

    def close(self, error: ResponsesError) -> None:
        """The stream ended: every wait ends with ``error``, every successor queue ends."""
        for target in self._targets.values():
            while target.waiting:
                future = target.waiting.popleft()
                if not future.done():
                    future.set_exception(error)
            if target.follows is not None and not target.follows.done():
                target.follows.set_exception(error)
        for _, queue in self._running.values():
            queue.put_nowait(None)
        self._running.clear()
