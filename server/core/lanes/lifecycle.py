"""The lanes of one stream as a sans-I/O state machine.

``LaneMachine`` owns the rules of WebSocket mode's lanes (``stream_id``) and of steering, and
nothing else: no tasks, queues, clocks or sockets. It is fed client events (``create``,
``steer``) and what the runs report (``created``, ``waiting``, ``resumed``, ``ended``), and it
answers with actions for its driver (``session.Session``) to carry out: ``Start`` a create,
``Emit`` a server event, ``StopAtBoundary`` a steered response. Unit tests drive it directly,
without an event loop (``tests/core/test_lifecycle.py``).

The rules, as the hosted WebSocket mode has them:

- each lane runs its creates in order, one at a time; a create on a busy lane waits its turn;
- at most ``max_active`` responses run per stream; further creates wait (at most
  ``max_queued`` of them, then an error);
- at most ``max_named_lanes`` distinct named lanes per stream (the default lane ``""`` does
  not count; a lane stays counted once used);
- a steer is accepted for a response that is running (after its ``response.created``), at
  most ``max_pending_steers`` per response. The steered response stops at its next safe
  output boundary; when it ends (completed or incomplete), an automatic successor runs next on
  its lane with the queued input. If it ended with client tool calls, the steers wait for the
  client's next create on that parent and lane (``response.steer.pending``), which gets the
  input before its own. In append mode the response waits instead of ending, and the append
  that answers its calls takes the input (``resumed``).
- every accepted steer is committed (a successor's or explicit continuation's
  ``response.created``) or answered with ``response.steer.failed`` carrying its id.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, TypeAlias

from bidi_responses.schema import (
    FailedSteer,
    JSONObject,
    JSONValue,
    RequiredInputStub,
    ResponseSteerAcceptedEvent,
    ResponseSteerFailedEvent,
    ResponseSteerPendingEvent,
    ServerEvent,
)

from ..api.errors import ApiError

# Responses that ended on a stream, remembered so that a steer for one gets
# ``response_already_completed`` rather than ``response_not_found``.
_ENDED_REMEMBERED = 4096


class LanePhase(StrEnum):
    """Where a lane is in its lifecycle."""

    IDLE = "idle"
    # Its next create waits for one of the stream's active-response slots.
    QUEUED = "queued"
    ACTIVE = "active"
    # Its response has accepted steers: it stops at its next safe output boundary.
    STEERING = "steering"
    # Its append-mode response sits in ``response.done`` until the client's tool outputs.
    WAITING_FOR_TOOL_OUTPUTS = "waiting_for_tool_outputs"
    # An automatic successor is being created (its ``response.created`` is the commit point).
    SUCCESSOR = "successor"


@dataclass(frozen=True, slots=True)
class LaneLimits:
    """The stream's lane bounds (hosted values by default)."""

    max_active: int = 16
    max_queued: int = 256
    max_named_lanes: int = 32
    max_pending_steers: int = 16
    # The error code past ``max_named_lanes`` (WebSocket mode's own name on that wire).
    lane_limit_code: str = "websocket_stream_limit_reached"


@dataclass(slots=True)
class Steer:
    """An accepted steering submission, owned by the server until committed or failed."""

    id: str
    target: str
    input: JSONValue
    items: tuple[JSONObject, ...]
    # ``response.steer.pending`` was sent (at most once per steer).
    announced: bool = False


@dataclass(slots=True)
class Ticket:
    """One create on its way through a lane, from arrival to its end."""

    number: int
    lane: str
    previous_response_id: str | None
    # The driver's own data for the create (its body); None for an automatic successor.
    payload: object = None
    # The response an automatic successor continues.
    successor_of: str | None = None
    # Steering input this create commits at its ``response.created``, in submission order.
    steers: list[Steer] = field(default_factory=list)
    response_id: str | None = None
    waiting: bool = False


@dataclass(frozen=True, slots=True)
class Start:
    """Run ``ticket`` now (its input: the steers' items, then its own)."""

    ticket: Ticket


@dataclass(frozen=True, slots=True)
class Emit:
    """Send ``event`` on ``lane``."""

    lane: str
    event: ServerEvent


@dataclass(frozen=True, slots=True)
class StopAtBoundary:
    """Stop ``response_id`` once its current output item is done."""

    response_id: str


Action: TypeAlias = Start | Emit | StopAtBoundary

#: How a run ended: ``refused`` = an error event before its ``response.created``;
#: ``cancelled`` = cancelled by the client, or its stream went away.
RunStatus: TypeAlias = Literal["refused", "completed", "incomplete", "failed", "cancelled"]


@dataclass(slots=True)
class _Lane:
    id: str
    queue: deque[Ticket] = field(default_factory=deque)
    running: Ticket | None = None
    # Steers waiting for the client's explicit create on a parent (by parent id).
    parked: dict[str, list[Steer]] = field(default_factory=dict)


class LaneMachine:
    """The lanes of one stream: what runs, what waits, and where steering input goes."""

    def __init__(self, limits: LaneLimits, new_steer_id: Callable[[], str]) -> None:
        self.limits = limits
        self._new_steer_id = new_steer_id
        self._lanes: dict[str, _Lane] = {}
        self._named = 0
        self._tickets = 0
        self._running: dict[int, Ticket] = {}
        self._queued = 0
        # Running responses by id (after their response.created), and their pending steers.
        self._by_response: dict[str, Ticket] = {}
        self._pending: dict[str, list[Steer]] = {}
        # What a waiting append-mode response needs from the client.
        self._stubs: dict[str, list[RequiredInputStub]] = {}
        # Ended responses: id -> (lane, completed or incomplete), for steer answers.
        self._ended: OrderedDict[str, tuple[str, bool]] = OrderedDict()
        self._seq = 0

    # -- observation ------------------------------------------------------------------------

    @property
    def active(self) -> int:
        """Responses running now (started, not ended)."""
        return len(self._running)

    @property
    def queued(self) -> int:
        """Creates waiting for their lane or for a slot."""
        return self._queued

    @property
    def lanes(self) -> list[str]:
        """Every lane used on this stream."""
        return list(self._lanes)

    def phase(self, lane_id: str) -> LanePhase:
        lane = self._lanes.get(lane_id)
        if lane is None or (lane.running is None and not lane.queue):
            return LanePhase.IDLE
        run = lane.running
        if run is None:
            return LanePhase.QUEUED
        if run.successor_of is not None and run.response_id is None:
            return LanePhase.SUCCESSOR
        if run.waiting:
            return LanePhase.WAITING_FOR_TOOL_OUTPUTS
        if run.response_id is not None and self._pending.get(run.response_id):
            return LanePhase.STEERING
        return LanePhase.ACTIVE

    def running(self, lane_id: str) -> Ticket | None:
        """The lane's running create, if any."""
        lane = self._lanes.get(lane_id)
        return lane.running if lane is not None else None

    def outstanding(self) -> list[Steer]:
        """Accepted steers not yet committed or failed (pending, parked or being committed)."""
        steers = [steer for pending in self._pending.values() for steer in pending]
        for lane in self._lanes.values():
            for parked in lane.parked.values():
                steers.extend(parked)
            if lane.running is not None and lane.running.response_id is None:
                steers.extend(lane.running.steers)
            for ticket in lane.queue:
                steers.extend(ticket.steers)
        return steers

    def has_pending(self, response_id: str) -> bool:
        """Whether ``response_id`` has accepted steers waiting for it to end."""
        return bool(self._pending.get(response_id))

    def has_ended(self, response_id: str) -> bool:
        """Whether ``response_id`` ran on this stream and has ended."""
        return response_id in self._ended

    def next_seq(self) -> int:
        """The next ``sequence_number`` of the stream's control events (steer, inject)."""
        self._seq += 1
        return self._seq

    # -- client events ----------------------------------------------------------------------

    def create(self, lane_id: str, previous: str | None, payload: object) -> list[Action]:
        """A ``response.create`` on ``lane_id``: starts now, or waits its turn.

        ApiError (nothing changes) past the lane or queue limits."""
        lane = self._lanes.get(lane_id)
        if lane is None:
            if lane_id and self._named >= self.limits.max_named_lanes:
                raise ApiError(
                    f"Invalid 'stream_id': at most {self.limits.max_named_lanes} distinct "
                    "named streams per connection.",
                    code=self.limits.lane_limit_code,
                    param="stream_id",
                )
            lane = self._lanes[lane_id] = _Lane(lane_id)
            self._named += bool(lane_id)
        if (lane.running is not None or lane.queue or self.active >= self.limits.max_active) and (
            self._queued >= self.limits.max_queued
        ):
            raise ApiError(
                f"Too many queued responses on this connection (at most "
                f"{self.limits.max_queued}); wait for some to finish before creating more.",
                code="too_many_queued_responses",
                status=429,
            )
        self._tickets += 1
        lane.queue.append(Ticket(self._tickets, lane_id, previous, payload))
        self._queued += 1
        return self._pump()

    def steer(
        self, target: str, raw_input: JSONValue, items: tuple[JSONObject, ...]
    ) -> list[Action]:
        """A valid ``response.steer`` for ``target``: accepted, or failed with its code."""
        ticket = self._by_response.get(target)
        if ticket is None:
            ended = self._ended.get(target)
            if ended is None:
                return [
                    self._refuse(
                        "",
                        target,
                        raw_input,
                        "response_not_found",
                        f"No response '{target}' is active on this connection.",
                    )
                ]
            lane_id, completed = ended
            code = "response_already_completed" if completed else "response_not_active"
            return [
                self._refuse(
                    lane_id,
                    target,
                    raw_input,
                    code,
                    f"Response '{target}' has ended and takes no more steering input.",
                )
            ]
        pending = self._pending.setdefault(target, [])
        if len(pending) >= self.limits.max_pending_steers:
            return [
                self._refuse(
                    ticket.lane,
                    target,
                    raw_input,
                    "too_many_pending_steers",
                    f"Response '{target}' already has {len(pending)} pending steering inputs "
                    f"(at most {self.limits.max_pending_steers}).",
                )
            ]
        steer = Steer(self._new_steer_id(), target, raw_input, items)
        pending.append(steer)
        accepted: ResponseSteerAcceptedEvent = {
            "type": "response.steer.accepted",
            "steer": {"id": steer.id, "previous_response_id": target},
            "sequence_number": self.next_seq(),
        }
        actions: list[Action] = [Emit(ticket.lane, accepted)]
        if ticket.waiting:
            actions += self._announce(ticket.lane, [steer], self._stubs.get(target, []))
        elif len(pending) == 1:
            actions.append(StopAtBoundary(target))
        return actions

    def refuse_steer(self, target: str, raw_input: JSONValue, code: str, message: str) -> Emit:
        """``response.steer.failed`` for a steer refused before it got an id (bad input); on
        the target's lane when the target is known."""
        ticket = self._by_response.get(target)
        ended = self._ended.get(target)
        lane = ticket.lane if ticket is not None else ended[0] if ended is not None else ""
        return self._refuse(lane, target, raw_input, code, message)

    # -- what the runs report ---------------------------------------------------------------

    def created(self, number: int, response_id: str) -> list[Action]:
        """Run ``number`` sent its ``response.created``: it can be steered from now on, and
        the steering input it carries is committed."""
        ticket = self._running[number]
        ticket.response_id = response_id
        ticket.steers = []  # committed
        self._by_response[response_id] = ticket
        return []

    def waiting(self, response_id: str, stubs: list[RequiredInputStub]) -> list[Action]:
        """An append-mode response waits for client tool outputs (``response.done``)."""
        ticket = self._by_response[response_id]
        ticket.waiting = True
        self._stubs[response_id] = stubs
        return self._announce(ticket.lane, self._pending.get(response_id, []), stubs)

    def resumed(self, response_id: str) -> list[Steer]:
        """The client's tool outputs were accepted: the waiting response goes on, and takes
        the pending steering input (committed now), returned in submission order."""
        ticket = self._by_response[response_id]
        ticket.waiting = False
        self._stubs.pop(response_id, None)
        return self._pending.pop(response_id, [])

    def ended(
        self,
        number: int,
        status: RunStatus,
        required: list[RequiredInputStub] | None = None,
        *,
        parent_lost: bool = False,
    ) -> list[Action]:
        """Run ``number`` ended (``required``: the client tool calls it ended with;
        ``parent_lost``: it was refused because its ``previous_response_id`` is gone)."""
        ticket = self._running.pop(number)
        lane = self._lanes[ticket.lane]
        lane.running = None
        actions: list[Action] = []
        response_id = ticket.response_id
        if ticket.steers:  # never reached its response.created: nothing was committed
            if ticket.successor_of is not None:
                actions += [
                    self._fail(
                        ticket.lane,
                        steer,
                        "successor_creation_failed",
                        "The automatic successor response could not be created.",
                    )
                    for steer in ticket.steers
                ]
            elif parent_lost:
                # Nothing can continue that parent any more: the input comes back.
                actions += [
                    self._fail(
                        ticket.lane,
                        steer,
                        "response_not_found",
                        f"Response '{steer.target}' is no longer available to continue.",
                    )
                    for steer in ticket.steers
                ]
            elif ticket.previous_response_id is not None:
                # The explicit continuation failed: the input waits for the next one.
                lane.parked.setdefault(ticket.previous_response_id, [])[:0] = ticket.steers
        if response_id is not None:
            del self._by_response[response_id]
            self._stubs.pop(response_id, None)
            self._ended[response_id] = (ticket.lane, status in ("completed", "incomplete"))
            while len(self._ended) > _ENDED_REMEMBERED:
                self._ended.popitem(last=False)
            pending = self._pending.pop(response_id, [])
            if pending:
                actions += self._after_steered(lane, response_id, status, pending, required or [])
        return actions + self._pump()

    # -- internals --------------------------------------------------------------------------

    def _after_steered(
        self,
        lane: _Lane,
        response_id: str,
        status: RunStatus,
        pending: list[Steer],
        required: list[RequiredInputStub],
    ) -> list[Action]:
        if status == "cancelled":
            return [
                self._fail(
                    lane.id,
                    steer,
                    "response_not_active",
                    "The response was cancelled before the steering input was applied.",
                )
                for steer in pending
            ]
        if status != "completed" and status != "incomplete":
            return [
                self._fail(
                    lane.id,
                    steer,
                    "successor_creation_failed",
                    f"Response '{response_id}' failed; no successor can continue it.",
                )
                for steer in pending
            ]
        if required:
            lane.parked.setdefault(response_id, []).extend(pending)
            return self._announce(lane.id, pending, required)
        self._tickets += 1
        successor = Ticket(self._tickets, lane.id, response_id, successor_of=response_id)
        successor.steers = pending
        lane.queue.appendleft(successor)
        self._queued += 1
        return []

    def _pump(self) -> list[Action]:
        """Start what can start: each idle lane's next create, successors first, then in
        arrival order, while the stream has slots."""
        ready = [lane for lane in self._lanes.values() if lane.running is None and lane.queue]
        ready.sort(key=lambda lane: (lane.queue[0].successor_of is None, lane.queue[0].number))
        actions: list[Action] = []
        for lane in ready:
            if self.active >= self.limits.max_active:
                break
            ticket = lane.queue.popleft()
            self._queued -= 1
            if ticket.successor_of is None and ticket.previous_response_id is not None:
                ticket.steers = lane.parked.pop(ticket.previous_response_id, [])
            lane.running = ticket
            self._running[ticket.number] = ticket
            actions.append(Start(ticket))
        return actions

    def _announce(
        self, lane_id: str, steers: list[Steer], required: list[RequiredInputStub]
    ) -> list[Action]:
        actions: list[Action] = []
        for steer in steers:
            if steer.announced:
                continue
            steer.announced = True
            event: ResponseSteerPendingEvent = {
                "type": "response.steer.pending",
                "steer": {"id": steer.id, "previous_response_id": steer.target},
                "reason": "waiting_for_required_input",
                "required_input": list(required),
                "sequence_number": self.next_seq(),
            }
            actions.append(Emit(lane_id, event))
        return actions

    def _fail(self, lane_id: str, steer: Steer, code: str, message: str) -> Emit:
        return self._refuse(lane_id, steer.target, steer.input, code, message, steer.id)

    def _refuse(
        self,
        lane_id: str,
        target: str,
        raw_input: JSONValue,
        code: str,
        message: str,
        steer_id: str | None = None,
    ) -> Emit:
        steer: FailedSteer = {"previous_response_id": target, "input": _echoed(raw_input)}
        if steer_id is not None:
            steer["id"] = steer_id
        event: ResponseSteerFailedEvent = {
            "type": "response.steer.failed",
            "steer": steer,
            "error": {"code": code, "message": message, "type": "invalid_request_error"},
            "sequence_number": self.next_seq(),
        }
        return Emit(lane_id, event)


#: The most characters of a failed steer's input echoed back in ``response.steer.failed``.
#: The echo lets a client resend the input elsewhere; a larger one costs the writer seconds of
#: encoding on the event loop and is refused by stock gRPC clients (4 MiB per message), which
#: would end the whole stream over one refused steer. The client has the input it sent.
ECHO_MAX_CHARS = 1_048_576


def _echoed(raw_input: JSONValue) -> JSONValue:
    """``raw_input`` as echoed in ``response.steer.failed``: as sent, or, past
    ``ECHO_MAX_CHARS``, empty of its kind (``""`` for a string, ``[]`` otherwise)."""
    if _chars_within(raw_input, ECHO_MAX_CHARS) is not None:
        return raw_input
    return "" if isinstance(raw_input, str) else []


def _chars_within(value: JSONValue, budget: int) -> int | None:
    """What is left of ``budget`` after the characters of ``value``'s strings and keys (and
    one for every other value); None once it is spent. Iterative, and it stops where the
    budget runs out, so any depth or size of input costs at most ``budget`` steps."""
    stack: list[JSONValue] = [value]
    while stack:
        top = stack.pop()
        if isinstance(top, str):
            budget -= len(top)
        elif isinstance(top, dict):
            budget -= 1 + sum(len(key) for key in top)
            stack.extend(top.values())
        elif isinstance(top, list):
            budget -= 1
            stack.extend(top)
        else:
            budget -= 1
        if budget < 0:
            return None
    return budget
