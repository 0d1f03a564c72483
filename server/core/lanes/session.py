"""A stream's session: the asyncio driver of its lanes, cache, in-flight responses and limits.

The stream driver (``transports/streams``) opens one Session per Connect call or WebSocket
connection, feeds it typed client events (``handle_event``; ``handle`` takes the JSON form)
and writes out what it produces (``events``, ``event_batches``). The session never raises into
the transport: a bad event becomes an ``error`` (or ``response.steer.failed``) event and the
stream goes on.

The lanes' rules and state live in ``lifecycle.LaneMachine`` (sans-I/O); the session keeps
only I/O: the runs' tasks, the runs by ticket, the outbox. It types each create when it arrives
(``LaneCreate``), feeds the machine the client's events and what its runs report
(``run_link.RunLink``), and carries out the machine's actions (``apply``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from functools import partial
from typing import cast

from bidi_responses.schema import Item, JSONValue, ServerEvent

from ...config import StreamingConfig
from ..api.client_events import (
    AppendEvent,
    CancelEvent,
    ClientEvent,
    CreateEvent,
    EventRefused,
    InjectEvent,
    SteerEvent,
    parse_json_event,
)
from ..api.errors import ApiError, not_waiting, server_error
from ..api.ids import new_id
from ..conversation.state import ResponseCache
from ..runs import continuation
from ..runs.deps import RunDeps
from ..runs.lane import Lane
from ..runs.record import OutEvent, answers_to, error_event
from ..runs.runner import ResponseRun
from ..tenancy.caller import ANONYMOUS, Caller
from .actions import (
    Action,
    CancelRun,
    Emit,
    LaneLimits,
    Offer,
    Refuse,
    Start,
    StopAtBoundary,
    Ticket,
)
from .lane_create import LaneCreate
from .lifecycle import LaneMachine
from .naming import StreamNaming
from .outbound import Outbox
from .run_link import RunLink, end_of
from .stream_end import age_limit_reached, age_limit_warning, draining_warning, shutting_down


class Session:
    """One stream (Connect call or WebSocket connection); a one-shot create has none
    (``runs/one_shot.py``)."""

    def __init__(self, deps: RunDeps, naming: StreamNaming, *, caller: Caller = ANONYMOUS) -> None:
        self.deps = deps
        # Who opened the stream: its tenant owns what the stream creates.
        self.caller = caller
        self.quota_key = caller.quota_key
        self.naming = naming
        self.transport = naming.transport
        # The authenticated tenant (None on an open server).
        self.tenant = caller.tenant
        # Why the server ended the stream (age limit, drain), for the transport's final status.
        self.end_error: ApiError | None = None
        limits = deps.config.limits
        # Deltas still waiting in it are merged when the writer falls behind (outbound.py).
        self._out = Outbox(
            limits.outbound_queue_events, merge=deps.config.streaming.coalesce_deltas
        )
        self._lanes: dict[str, Lane] = {}
        self._runs: set[asyncio.Task[None]] = set()
        # One cache per stream, serving every lane (a create on one lane can fork another's).
        cache_config = deps.config.cache
        self.cache = ResponseCache(
            cache_config.max_responses, cache_config.max_bytes, deps.cache_budget
        )
        self.machine: LaneMachine[LaneCreate] = LaneMachine(
            LaneLimits(
                max_active=limits.max_active_responses,
                max_queued=limits.max_queued_responses,
                max_named_lanes=limits.max_lanes,
                max_pending_steers=limits.max_pending_steers,
                lane_limit_code=naming.lane_limit_code,
            ),
            lambda: new_id("steer"),
        )
        # The runs the machine started, by ticket number, until their tasks are done.
        self._started: dict[int, ResponseRun] = {}
        self._watchdog: asyncio.Task[None] | None = None
        self._closed = False
        self._stopping = False
        # How engine output becomes deltas for the responses this stream starts (a transport
        # may set a coarser delta window its client asked for).
        self.streaming: StreamingConfig = deps.config.streaming

    # -- the stream's life ------------------------------------------------------------------

    def start_age_limit(self) -> None:
        """Warn before, and end the stream at, the configured connection age limit."""
        self._watchdog = asyncio.get_running_loop().create_task(self._age_limit())

    async def _age_limit(self) -> None:
        limits = self.deps.config.limits
        prefix = self.naming.age_limit_prefix
        warn_after = max(limits.connection_max_age_s - limits.connection_warning_s, 0)
        await asyncio.sleep(warn_after)
        await self._out.put(OutEvent("", age_limit_warning(limits, prefix)))
        await asyncio.sleep(limits.connection_max_age_s - warn_after)
        error = self.end_error = age_limit_reached(limits, prefix)
        await self._out.put(OutEvent("", error_event(400, error.to_error_object())))
        await self.finish(wait_for_runs=False)

    def warn_draining(self, grace_s: float) -> None:
        """Tell the client that this server is draining: finish the turn in flight here, send
        the next one on a new stream."""
        self.end_error = shutting_down()
        # A client that reads nothing (a full queue) gets the stream's end as its signal.
        with contextlib.suppress(asyncio.QueueFull):
            self._out.put_nowait(OutEvent("", draining_warning(grace_s)))

    async def finish(self, *, wait_for_runs: bool = True) -> None:
        """No more client events: let in-flight responses end (or stop them), then end.

        A response waiting for tool outputs can get none any more, so it ends at once.
        """
        for lane in self._lanes.values():
            lane.input_closed = True
        await self.apply(self.machine.end_of_input())
        if wait_for_runs:
            while self._runs:
                await asyncio.gather(*list(self._runs), return_exceptions=True)
        else:
            await self._stop_runs()
        await self._out.put(None)

    async def hand_off_idle(self) -> None:
        """Leave the cached states of this stream's idle lanes in the shared tier, for the
        replica that gets their next turn (handoff.py). A lane with a response in flight
        leaves its state when that response ends."""
        if self.deps.state_tier is None:
            return
        busy = {lane.id for lane in self._lanes.values() if lane.inflight is not None}
        states = [
            (response_id, state)
            for response_id, state, lane in self.cache.owned_entries()
            # the store has the chain this state renders
            if lane not in busy and state.stored_chain
        ]
        await continuation.save_states(self.deps, states)

    async def close(self) -> None:
        """The client is gone: stop in-flight engine work and drop the caches."""
        if self._closed:
            return
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        await self._stop_runs()
        self.cache.clear()
        for lane in self._lanes.values():
            await lane.affinity.aclose()
        self.deps.metrics.open_lanes.dec(len(self._lanes))
        self._lanes.clear()

    async def _stop_runs(self) -> None:
        self._stopping = True  # what the stopped runs would start next is not started
        runs = list(self._runs)
        for task in runs:
            task.cancel()
        if runs:
            await asyncio.gather(*runs, return_exceptions=True)

    # -- what the transport reads ------------------------------------------------------------

    @property
    def quiet(self) -> bool:
        """Nothing runs or waits, and every event was taken by the transport."""
        machine = self.machine
        return not self._runs and not machine.active and not machine.queued and self._out.empty()

    async def events(self) -> AsyncIterator[OutEvent]:
        """Server events in order, until the session finishes."""
        while True:
            event = await self._out.get()
            if event is None:
                return
            yield event
            # Not kept while waiting for the next: an idle stream would hold its last event
            # (a terminal event carries the whole response).
            del event

    async def event_batches(self, max_events: int) -> AsyncIterator[list[OutEvent]]:
        """Server events in order, as lists of what is ready when the transport asks.

        Waits only for the first event of a list; the rest are the events already queued
        behind it (at most ``max_events`` in all). Nothing is held back to fill a list, except
        the rest of a step known to follow without waiting for the engine (``Outbox.take``).
        """
        while True:
            batch = await self._out.take(max_events)
            ended = batch[-1] is None
            ready = [out for out in batch if out is not None]
            del batch
            if ready:
                yield ready
            # Not kept while waiting for the next batch (as in ``events``).
            del ready
            if ended:
                return

    def hold(self, lane: str) -> None:
        """More of ``lane``'s step follows at once (an engine segment finished): a batching
        writer waits for it (``Outbox.hold``)."""
        self._out.hold(lane)

    async def emit(self, lane: str, data: ServerEvent) -> None:
        """Queue a server event for the transport (waits while the client is slow)."""
        if data["type"] == "error":
            self.deps.metrics.error(self.transport, data["status"], data["error"]["code"])
        await self._out.put(OutEvent(lane, data))

    # -- client events -----------------------------------------------------------------------

    async def handle(self, event: JSONValue, received: float | None = None) -> None:
        """Act on one client event (JSON-shaped); problems become error events on the stream."""
        received = time.perf_counter() if received is None else received
        try:
            typed = parse_json_event(event, self.deps.config.limits)
        except EventRefused as refused:
            await self.refuse(refused, event)
            return
        await self.handle_event(typed, received)

    async def refuse(self, refused: EventRefused, event: JSONValue = None) -> None:
        """Answer a client event that could not be typed (``event``: as sent, if known)."""
        if refused.__cause__ is not None:
            self.deps.log.error(
                "client event unreadable on a %s stream",
                self.transport,
                exc_info=refused.__cause__,
            )
        await self._error(refused.lane, refused.error, answers_to(event))

    async def handle_event(self, event: ClientEvent, received: float | None = None) -> None:
        """Act on one typed client event (which says what an error about it answers)."""
        received = time.perf_counter() if received is None else received
        answers = event.answers
        machine = self.machine
        try:
            if isinstance(event, CreateEvent):
                await self._create(event, received, answers)
            elif isinstance(event, SteerEvent):
                await self._steer(event)
            elif isinstance(event, AppendEvent):
                actions = machine.append(event.lane, event.response_id, event.input)
                await self.apply(actions, answers)
            elif isinstance(event, InjectEvent):
                await self._inject(event, answers)
            else:
                await self._cancel(event, answers)
        except Exception:
            # A server fault, not the client's: logged with its traceback; the client gets a
            # generic 500 without exception text, and the stream goes on.
            self.deps.log.exception("client event failed on a %s stream", self.transport)
            await self._error(self._lane_of(event), server_error(), answers)

    def _lane_of(self, event: ClientEvent) -> str:
        """The lane an event's errors go to (an inject's: its response's)."""
        if isinstance(event, InjectEvent):
            ticket = self.machine.responding(event.response_id)
            return ticket.lane if ticket is not None else ""
        return "" if isinstance(event, SteerEvent) else event.lane

    async def _create(
        self, event: CreateEvent, received: float, answers: Mapping[str, object]
    ) -> None:
        refused = self.machine.admit(event.lane)
        if refused:
            await self.apply(refused, answers)
            return
        lane = self._lane(event.lane)
        try:
            # Typed now, with the lane's tools: an invalid create is refused at once.
            request = lane.parse(event.body, self.deps.config.limits)
        except ApiError:
            # The refusing run takes the event id out of its own copy of the body.
            self._refuse_create(lane, dict(event.body), received)
            return
        create = LaneCreate(request, event.event_id, received)
        await self.apply(self.machine.create(event.lane, create))

    def _refuse_create(self, lane: Lane, body: dict[str, JSONValue], received: float) -> None:
        """Refuse an invalid create now, out of its lane's turn, through its run's own checks
        (a server shutting down or a spent rate limit is said first, as for any create), so
        it is counted and answered as every refused create is. It takes no ticket (no turn on
        its lane, no hooks): its link only emits."""
        run = ResponseRun(
            self.deps,
            lane,
            body,
            RunLink(self, lane.id, 0),
            self.transport,
            received,
            caller=self.caller,
            streaming=self.streaming,
        )
        self._track(asyncio.get_running_loop().create_task(run.run(), name=f"refusal {run.id}"))

    async def _steer(self, event: SteerEvent) -> None:
        machine = self.machine
        target = event.previous_response_id
        if event.problem is not None:
            problem = event.problem
            await self.apply(
                [machine.refuse_steer(target, event.input, problem.code, problem.message)]
            )
            return
        await self.apply(machine.steer(target, event.input, event.items))

    async def _inject(self, event: InjectEvent, answers: Mapping[str, object]) -> None:
        """``response.inject`` (beta): in append mode, the tool outputs a waiting response
        needs, committed as an append would; acknowledged either way."""
        ticket = self.machine.responding(event.response_id)
        run = self._started.get(ticket.number) if ticket is not None else None
        waiting = run is not None and run.waiting_for_append
        await self.apply(
            self.machine.inject(event.response_id, event.input, waiting=waiting), answers
        )

    async def _cancel(self, event: CancelEvent, answers: Mapping[str, object]) -> None:
        ticket = self.machine.running(event.lane)
        run = self._started.get(ticket.number) if ticket is not None else None
        run_id = run.id if run is not None else None
        await self.apply(self.machine.cancel(event.lane, event.response_id, run_id=run_id), answers)

    # -- carrying out the machine's actions --------------------------------------------------

    async def apply(
        self, actions: list[Action[LaneCreate]], answers: Mapping[str, object] | None = None
    ) -> None:
        """Carry out the machine's actions (``answers``: what a refusal answers)."""
        for action in actions:
            if isinstance(action, Start):
                self._start(action.ticket)
            elif isinstance(action, Emit):
                await self.emit(action.lane, action.event)
            elif isinstance(action, Refuse):
                await self._error(action.lane, action.error, answers)
            elif isinstance(action, StopAtBoundary):
                run = self._started.get(action.number)
                if run is not None:
                    run.stop_at_boundary()
            elif isinstance(action, Offer):
                await self._offer(action, answers)
            elif isinstance(action, CancelRun):
                run = self._started.get(action.number)
                if run is not None and (run.waiting_for_append or not action.if_waiting):
                    run.cancel(action.reason)

    async def _offer(self, offer: Offer, answers: Mapping[str, object] | None) -> None:
        run = self._started.get(offer.number)
        if run is None:  # the machine started it; this session has not yet
            await self._error(offer.lane, not_waiting(offer.response_id), answers)
            return
        try:
            run.offer_append(offer.response_id, offer.input)
        except ApiError as error:  # not waiting, or outputs that do not fit
            await self._error(offer.lane, error, answers)
            return
        if offer.inject:
            await self.apply(self.machine.injected(offer.response_id))

    async def _error(
        self, lane: str, error: ApiError, answers: Mapping[str, object] | None = None
    ) -> None:
        await self.emit(lane, error_event(error.status, error.to_error_object(), answers))

    def _lane(self, lane_id: str) -> Lane:
        """The I/O side of a lane the machine admitted (its tools, route, engine affinity)."""
        lane = self._lanes.get(lane_id)
        if lane is None:
            lane = self._lanes[lane_id] = Lane(lane_id, self.cache)
            self.deps.metrics.open_lanes.inc()
        return lane

    def _start(self, ticket: Ticket[LaneCreate]) -> None:
        lane = self._lane(ticket.lane)
        create = ticket.request
        # An explicit continuation commits the queued steering input before its own (a
        # successor's input is that steering input already).
        steering = (
            []
            if ticket.successor_of is not None
            else [cast(Item, dict(item)) for steer in ticket.steers for item in steer.items]
        )
        link = RunLink(self, ticket.lane, ticket.number)
        run = ResponseRun(
            self.deps,
            lane,
            create.request,
            link,
            self.transport,
            time.perf_counter() if create.received is None else create.received,
            caller=self.caller,
            hooks=link,
            steering=steering,
            streaming=self.streaming,
            event_id=create.event_id,
        )
        self._started[ticket.number] = run
        lane.inflight = run
        task = asyncio.get_running_loop().create_task(run.run(), name=f"response {run.id}")
        run.task = task
        self._track(task)
        # Called however the task ends, even when cancelled before it ever ran.
        task.add_done_callback(partial(self._done, run, ticket.number))

    def _track(self, task: asyncio.Task[None]) -> None:
        self._runs.add(task)
        task.add_done_callback(self._runs.discard)

    def _done(self, run: ResponseRun, number: int, task: asyncio.Task[None]) -> None:
        """A run's task is done (however it ended, even cancelled before it ever ran): act on
        what the machine answered to its end, after the run's own last event."""
        actions = self.machine.done(number, end_of(run))
        self._out.release(run.lane.id)  # a step held by the run ends with it
        del self._started[number]
        if run.lane.inflight is run:
            run.lane.inflight = None
        if actions and not self._stopping:
            self._track(asyncio.get_running_loop().create_task(self.apply(actions)))
