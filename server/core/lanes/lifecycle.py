"""The lanes of one stream as a sans-I/O state machine.

``LaneMachine`` owns the rules and the state of WebSocket mode's lanes (``stream_id``) and of
steering, and nothing else: no tasks, queues, clocks or sockets. It is generic over the typed
request of a create (``actions.LaneRequest``). It is fed the client's events (``admit`` and
``create``, ``steer``, ``append``, ``inject``, ``cancel``, ``end_of_input``), what the runs report
(``created``, ``waiting``, ``resumed``, ``ending``, ``done``); it answers with actions for
its driver (``session.Session``) to carry out (``actions.py``): ``Start`` a create, ``Emit`` a
server event, ``Refuse`` the event with an error, ``StopAtBoundary`` a steered run, ``Offer``
tool outputs to a run, ``CancelRun``. It never raises a refusal. Unit tests drive it directly,
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
  its lane with the queued input (its request: the steered one's, continued with that input).
  If it ended with client tool calls, the steers wait for the client's next create on that
  parent and lane (``response.steer.pending``), which gets the input before its own. In append
  mode the response waits instead of ending, and the append that answers its calls takes the
  input (``resumed``).
- every accepted steer is committed (a successor's or explicit continuation's
  ``response.created``) or answered with ``response.steer.failed`` carrying its id;
- an append or cancel goes to the lane's running response, an inject to the response it
  names; once the client sends nothing more, a response waiting for tool outputs ends.
- what follows a run's end (the lane's next create, a successor, ``steer.pending``) is held
  until the run's task is done, so it comes after the run's own last event.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Generic

from bidi_responses.schema import JSONObject, JSONValue, RequiredInputStub

from ..api.errors import ApiError, not_waiting
from ..process import SmallDeque
from .actions import (
    Action,
    CancelRun,
    Emit,
    LaneLimits,
    Offer,
    Refuse,
    Request,
    RunEnd,
    RunStatus,
    Start,
    Steer,
    StopAtBoundary,
    Ticket,
)
from .control_events import inject_created, inject_failed
from .steering import SteerBook


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


@dataclass(slots=True)
class _Lane(Generic[Request]):
    id: str
    queue: SmallDeque[Ticket[Request]] = field(default_factory=SmallDeque)
    running: Ticket[Request] | None = None
    # Steers waiting for the client's explicit create on a parent (by parent id).
    parked: dict[str, list[Steer]] = field(default_factory=dict)


class LaneMachine(Generic[Request]):
    """The lanes of one stream: what runs, what waits, and where steering input goes."""

    def __init__(self, limits: LaneLimits, new_steer_id: Callable[[], str]) -> None:
        self.limits = limits
        self._steers = SteerBook(limits, new_steer_id)
        self._lanes: dict[str, _Lane[Request]] = {}
        self._named = 0
        self._tickets = 0
        self._running: dict[int, Ticket[Request]] = {}
        self._queued = 0
        # Running responses by id (after their response.created).
        self._by_response: dict[str, Ticket[Request]] = {}
        # What the machine answered to the end of a run whose task is not done yet.
        self._held: dict[int, list[Action[Request]]] = {}

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
        if run.response_id is not None and self._steers.has_pending(run.response_id):
            return LanePhase.STEERING
        return LanePhase.ACTIVE

    def running(self, lane_id: str) -> Ticket[Request] | None:
        """The lane's running create, if any."""
        lane = self._lanes.get(lane_id)
        return lane.running if lane is not None else None

    def responding(self, response_id: str) -> Ticket[Request] | None:
        """The create running as ``response_id`` (after its ``response.created``), if any."""
        return self._by_response.get(response_id)

    def outstanding(self) -> list[Steer]:
        """Accepted steers not yet committed or failed (pending, parked or being committed)."""
        steers = self._steers.pending()
        for lane in self._lanes.values():
            for parked in lane.parked.values():
                steers.extend(parked)
            if lane.running is not None and lane.running.response_id is None:
                steers.extend(lane.running.steers)
            for ticket in lane.queue:
                steers.extend(ticket.steers)
        return steers

    def has_ended(self, response_id: str) -> bool:
        """Whether ``response_id`` ran on this stream and has ended."""
        return self._steers.ended_on(response_id) is not None

    # -- client events ----------------------------------------------------------------------

    def admit(self, lane_id: str) -> list[Action[Request]]:
        """Whether a create on ``lane_id`` may wait for its turn: nothing (the lane is opened
        and counted), or its refusal past the lane or queue limits. Judged before the create's
        own request is checked, so these limits are said first."""
        lane = self._lanes.get(lane_id)
        if lane is None:
            if lane_id and self._named >= self.limits.max_named_lanes:
                error = ApiError(
                    f"Invalid 'stream_id': at most {self.limits.max_named_lanes} distinct "
                    "named streams per connection.",
                    code=self.limits.lane_limit_code,
                    param="stream_id",
                )
                return [Refuse(lane_id, error)]
            lane = self._lanes[lane_id] = _Lane(lane_id)
            self._named += bool(lane_id)
        if (lane.running is not None or lane.queue or self.active >= self.limits.max_active) and (
            self._queued >= self.limits.max_queued
        ):
            error = ApiError(
                f"Too many queued responses on this connection (at most "
                f"{self.limits.max_queued}); wait for some to finish before creating more.",
                code="too_many_queued_responses",
                status=429,
            )
            return [Refuse(lane_id, error)]
        return []

    def create(self, lane_id: str, request: Request) -> list[Action[Request]]:
        """A ``response.create`` on ``lane_id``: starts now, or waits its turn; refused
        (nothing changes) past the lane or queue limits (``admit``)."""
        refused = self.admit(lane_id)
        if refused:
            return refused
        self._tickets += 1
        self._lanes[lane_id].queue.append(Ticket(self._tickets, lane_id, request))
        self._queued += 1
        return self._pump()

    def steer(
        self, target: str, raw_input: JSONValue, items: tuple[JSONObject, ...]
    ) -> list[Action[Request]]:
        """A valid ``response.steer`` for ``target``: accepted, or failed with its code."""
        ticket = self._by_response.get(target)
        if ticket is None:
            return [self._steers.refuse_unknown(target, raw_input)]
        answers, stop = self._steers.accept(ticket.lane, target, raw_input, items, ticket.waiting)
        actions: list[Action[Request]] = [*answers]
        if stop:
            actions.append(StopAtBoundary(ticket.number))
        return actions

    def refuse_steer(self, target: str, raw_input: JSONValue, code: str, message: str) -> Emit:
        """``response.steer.failed`` for a steer refused before it got an id (bad input); on
        the target's lane when the target is known."""
        ticket = self._by_response.get(target)
        lane = ticket.lane if ticket is not None else self._steers.ended_on(target) or ""
        return self._steers.refuse(lane, target, raw_input, code, message)

    def append(self, lane_id: str, response_id: str, raw_input: JSONValue) -> list[Action[Request]]:
        """``response.append``: tool outputs for the lane's running response."""
        ticket = self._started(self._lanes.get(lane_id))
        if ticket is None:
            return [Refuse(lane_id, not_waiting(response_id))]
        return [Offer(ticket.number, ticket.lane, response_id, raw_input)]

    def inject(
        self, response_id: str, raw_input: JSONValue, *, waiting: bool
    ) -> list[Action[Request]]:
        """``response.inject`` (beta): tool outputs for ``response_id`` (``waiting``: its run
        waits for them now); refused with ``response.inject.failed`` otherwise."""
        ticket = self._by_response.get(response_id)
        if ticket is None or not waiting:
            known = ticket is not None or self.has_ended(response_id)
            failed = inject_failed(response_id, raw_input, known, self._steers.next_seq())
            return [Emit(ticket.lane if ticket is not None else "", failed)]
        return [Offer(ticket.number, ticket.lane, response_id, raw_input, inject=True)]

    def injected(self, response_id: str) -> list[Action[Request]]:
        """The run took the injected tool outputs: acknowledge them."""
        ticket = self._by_response.get(response_id)
        lane_id = ticket.lane if ticket is not None else ""
        return [Emit(lane_id, inject_created(response_id, self._steers.next_seq()))]

    def cancel(
        self, lane_id: str, response_id: str | None, *, run_id: str | None
    ) -> list[Action[Request]]:
        """``response.cancel``: the lane's running response (``response_id``, if given).
        ``run_id``: the id its run has now (before its ``response.created`` too: a retried
        create takes the id its idempotency key names, which the client may know)."""
        ticket = self._started(self._lanes.get(lane_id))
        named = response_id is not None and response_id != run_id
        if ticket is None or run_id is None or named:
            error = ApiError(
                f"No in-flight response '{response_id or ''}' on this stream to cancel.",
                code="response_not_found",
                param="response_id",
                status=404,
            )
            return [Refuse(lane_id, error)]
        return [CancelRun(ticket.number)]

    def end_of_input(self) -> list[Action[Request]]:
        """The client sends nothing more: a response waiting for tool outputs can get none,
        so it ends at once."""
        return [
            CancelRun(ticket.number, "client_gone", if_waiting=True)
            for ticket in self._running.values()
            if not ticket.held
        ]

    # -- what the runs report ---------------------------------------------------------------

    def created(self, number: int, response_id: str) -> list[Action[Request]]:
        """Run ``number`` sent its ``response.created``: it can be steered from now on, and
        the steering input it carries is committed."""
        ticket = self._running[number]
        ticket.response_id = response_id
        ticket.steers = []  # committed
        self._by_response[response_id] = ticket
        return []

    def waiting(self, response_id: str, stubs: list[RequiredInputStub]) -> list[Action[Request]]:
        """An append-mode response waits for client tool outputs (``response.done``)."""
        ticket = self._by_response[response_id]
        ticket.waiting = True
        return [*self._steers.waiting(ticket.lane, response_id, stubs)]

    def resumed(self, response_id: str) -> list[Steer]:
        """The client's tool outputs were accepted: the waiting response goes on, and takes
        the pending steering input (committed now), returned in submission order."""
        ticket = self._by_response[response_id]
        ticket.waiting = False
        return self._steers.resumed(response_id)

    def ending(self, number: int, end: RunEnd) -> None:
        """Run ``number`` is about to send its terminal event: from now on a steer finds it
        ended; what follows it (a successor, steer.pending) waits for ``done``."""
        actions = self._held[number] = self._end(number, end)
        for action in actions:
            if isinstance(action, Start):
                action.ticket.held = True

    def done(self, number: int, end: RunEnd) -> list[Action[Request]]:
        """Run ``number``'s task is done, however it ended (even cancelled before it ran): the
        actions that follow it, after its own last event."""
        actions = self._held.pop(number, None)
        if actions is None:
            return self._end(number, end)
        for action in actions:
            if isinstance(action, Start):
                action.ticket.held = False
        return actions

    # -- internals --------------------------------------------------------------------------

    def _started(self, lane: _Lane[Request] | None) -> Ticket[Request] | None:
        """The lane's running create, once its run was started."""
        ticket = lane.running if lane is not None else None
        return ticket if ticket is not None and not ticket.held else None

    def _end(self, number: int, end: RunEnd) -> list[Action[Request]]:
        ticket = self._running.pop(number)
        lane = self._lanes[ticket.lane]
        lane.running = None
        actions: list[Action[Request]] = []
        response_id = ticket.response_id
        if ticket.steers:  # never reached its response.created: nothing was committed
            if ticket.successor_of is not None:
                message = "The automatic successor response could not be created."
                actions += self._steers.fail(
                    ticket.lane, ticket.steers, "successor_creation_failed", message
                )
            elif end.parent_lost:
                # Nothing can continue that parent any more: the input comes back.
                target = ticket.previous_response_id
                message = f"Response '{target}' is no longer available to continue."
                actions += self._steers.fail(
                    ticket.lane, ticket.steers, "response_not_found", message
                )
            elif ticket.previous_response_id is not None:
                # The explicit continuation failed: the input waits for the next one.
                lane.parked.setdefault(ticket.previous_response_id, [])[:0] = ticket.steers
        if response_id is not None:
            del self._by_response[response_id]
            completed = end.status in ("completed", "incomplete")
            pending = self._steers.ended(ticket.lane, response_id, completed)
            if pending:
                actions += self._after_steered(lane, ticket, response_id, end, pending)
        return actions + self._pump()

    def _after_steered(
        self,
        lane: _Lane[Request],
        ticket: Ticket[Request],
        response_id: str,
        end: RunEnd,
        pending: list[Steer],
    ) -> list[Action[Request]]:
        status: RunStatus = end.status
        if status == "cancelled":
            message = "The response was cancelled before the steering input was applied."
            return [*self._steers.fail(lane.id, pending, "response_not_active", message)]
        if status != "completed" and status != "incomplete":
            message = f"Response '{response_id}' failed; no successor can continue it."
            return [*self._steers.fail(lane.id, pending, "successor_creation_failed", message)]
        if end.required:
            lane.parked.setdefault(response_id, []).extend(pending)
            return [*self._steers.announce(lane.id, pending, end.required)]
        # The successor: the steered response's request, continued with the queued input.
        steering = [dict(item) for steer in pending for item in steer.items]
        self._tickets += 1
        successor = Ticket(
            self._tickets,
            lane.id,
            ticket.request.successor(response_id, steering),
            successor_of=response_id,
            steers=pending,
        )
        lane.queue.appendleft(successor)
        self._queued += 1
        return []

    def _pump(self) -> list[Action[Request]]:
        """Start what can start: each idle lane's next create, successors first, then in
        arrival order, while the stream has slots."""
        ready = [lane for lane in self._lanes.values() if lane.running is None and lane.queue]
        ready.sort(key=lambda lane: (lane.queue[0].successor_of is None, lane.queue[0].number))
        actions: list[Action[Request]] = []
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
