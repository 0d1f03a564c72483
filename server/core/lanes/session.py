"""A stream's session: the asyncio driver of its lanes, cache, in-flight responses and limits.

The stream driver (``transports/streams``) opens one Session per Connect call or WebSocket
connection, feeds it typed client events (``handle_event``; ``handle`` takes the JSON form)
and writes out what it produces (``events``, ``event_batches``). The session never raises into
the transport: a bad event becomes an ``error`` (or ``response.steer.failed``) event and the
stream goes on.

The lane rules live in ``lifecycle.LaneMachine`` (sans-I/O); the session feeds it the client's
events and what its runs report, and carries out its actions: start a run as a task, emit an
event, stop a steered run at its next output boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from functools import partial
from typing import cast

from bidi_responses.schema import (
    FunctionCallItem,
    Item,
    JSONObject,
    JSONValue,
    ResponseInjectCreatedEvent,
    ResponseInjectFailedEvent,
    ServerEvent,
    WarningEvent,
)

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
from ..api.errors import ApiError, server_error
from ..api.ids import new_id
from ..runs.deps import RunDeps
from ..runs.record import OutEvent, answers_to, error_event
from ..runs.runner import ResponseRun
from ..tenancy.caller import ANONYMOUS, Caller
from . import continuation
from .lane import Lane
from .lifecycle import (
    Action,
    Emit,
    LaneLimits,
    LaneMachine,
    RunStatus,
    Start,
    StopAtBoundary,
    Ticket,
)
from .outbound import Outbox
from .state import ResponseCache

# Settings an automatic successor does not take from the response it continues.
_NOT_INHERITED = ("input", "previous_response_id", "idempotency_key", "generate", "event_id")


class Session:
    """One stream (Connect call or WebSocket connection); a one-shot create has none
    (``runs/one_shot.py``)."""

    def __init__(self, deps: RunDeps, transport: str, *, caller: Caller = ANONYMOUS) -> None:
        self.deps = deps
        # Who opened the stream: its tenant owns what the stream creates.
        self.caller = caller
        self.quota_key = caller.quota_key
        self.transport = transport
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
        self.machine = LaneMachine(
            LaneLimits(
                max_active=limits.max_active_responses,
                max_queued=limits.max_queued_responses,
                max_named_lanes=limits.max_lanes,
                max_pending_steers=limits.max_pending_steers,
                # WebSocket mode keeps the hosted code; other transports get a neutral name.
                lane_limit_code="websocket_stream_limit_reached"
                if transport == "websocket"
                else "stream_limit_reached",
            ),
            lambda: new_id("steer"),
        )
        # Started runs by ticket, and by response id once they sent response.created.
        self._started: dict[int, ResponseRun] = {}
        self._by_response: dict[str, ResponseRun] = {}
        self._ticket_of: dict[ResponseRun, Ticket] = {}
        # What the machine answered to the end of a run whose task is not done yet.
        self._settled: dict[int, list[Action]] = {}
        # The create body of each steered response whose successor has yet to start.
        self._successor_settings: dict[str, JSONObject] = {}
        self._watchdog: asyncio.Task[None] | None = None
        self._closed = False
        self._stopping = False
        self.opened_at = time.monotonic()
        # How engine output becomes deltas for the responses this stream starts (a transport
        # may set a coarser delta window its client asked for).
        self.streaming: StreamingConfig = deps.config.streaming

    # -- lifecycle ---------------------------------------------------------------------------

    def start_age_limit(self) -> None:
        """Warn before, and end the stream at, the configured connection age limit."""
        self._watchdog = asyncio.get_running_loop().create_task(self._age_limit())

    async def _age_limit(self) -> None:
        limits = self.deps.config.limits
        warn_after = max(limits.connection_max_age_s - limits.connection_warning_s, 0)
        # WebSocket mode keeps the hosted API's codes; other transports get neutral names.
        prefix = (
            "websocket_connection_limit"
            if self.transport == "websocket"
            else "connection_age_limit"
        )
        await asyncio.sleep(warn_after)
        warning: WarningEvent = {
            "type": "warning",
            "code": f"{prefix}_approaching",
            "message": f"This connection will be closed in "
            f"{limits.connection_warning_s:g} s (limit {limits.connection_max_age_s:g} s). "
            "Open a new one to continue.",
        }
        await self._out.put(OutEvent("", warning))
        await asyncio.sleep(limits.connection_max_age_s - warn_after)
        error = ApiError(
            f"The connection reached its limit of {limits.connection_max_age_s:g} s; "
            "open a new connection to continue.",
            code=f"{prefix}_reached",
        )
        self.end_error = error
        await self._out.put(OutEvent("", error_event(400, error.to_error_object())))
        await self.finish(wait_for_runs=False)

    def warn_draining(self, grace_s: float) -> None:
        """Tell the client that this server is draining: finish the turn in flight here, send
        the next one on a new stream (through the proxy, to another replica)."""
        event: WarningEvent = {
            "type": "warning",
            "code": "server_draining",
            "message": "This server is shutting down: responses in flight finish within "
            f"{grace_s:g} s, then the stream ends. Send new turns on a new connection.",
        }
        # The stream then ends UNAVAILABLE (gRPC) / 1012 (WebSocket), never OK.
        self.end_error = ApiError(
            "The server is shutting down; open a new stream to continue.",
            code="server_shutting_down",
            status=503,
            type="server_error",
        )
        # A client that reads nothing (a full queue) gets the stream's end as its signal.
        with contextlib.suppress(asyncio.QueueFull):
            self._out.put_nowait(OutEvent("", event))

    async def finish(self, *, wait_for_runs: bool = True) -> None:
        """No more client events: let in-flight responses end (or stop them), then end.

        A response waiting for tool outputs can get none any more, so it ends at once.
        """
        for lane in self._lanes.values():
            lane.input_closed = True
        for run in list(self._started.values()):
            if run.waiting_for_append:
                run.cancel("client_gone")
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

    # -- client events -----------------------------------------------------------------------

    def _lane(self, lane_id: str) -> Lane:
        """The I/O side of a lane the machine admitted (its tools, route, engine affinity)."""
        lane = self._lanes.get(lane_id)
        if lane is None:
            lane = self._lanes[lane_id] = Lane(lane_id, self.cache)
            self.deps.metrics.open_lanes.inc()
        return lane

    async def emit(self, lane: str, data: ServerEvent) -> None:
        """Queue a server event for the transport (waits while the client is slow)."""
        if data["type"] == "error":
            self.deps.metrics.error(self.transport, data["status"], data["error"]["code"])
        await self._out.put(OutEvent(lane, data))

    async def _error(self, lane: str, error: ApiError, event: JSONValue = None) -> None:
        await self.emit(lane, error_event(error.status, error.to_error_object(), answers_to(event)))

    async def handle(self, event: JSONValue, received: float | None = None) -> None:
        """Act on one client event (JSON-shaped); problems become error events on the stream."""
        received = time.perf_counter() if received is None else received
        try:
            typed = parse_json_event(event, self.deps.config.limits)
        except EventRefused as refused:
            await self.refuse(refused, event)
            return
        await self.handle_event(typed, received, event)

    async def refuse(self, refused: EventRefused, event: JSONValue = None) -> None:
        """Answer a client event that could not be typed (``event``: as sent, if known)."""
        if refused.__cause__ is not None:
            self.deps.log.error(
                "client event unreadable on a %s stream",
                self.transport,
                exc_info=refused.__cause__,
            )
        await self._error(refused.lane, refused.error, event)

    async def handle_event(
        self, event: ClientEvent, received: float | None = None, raw: JSONValue = None
    ) -> None:
        """Act on one typed client event (``raw``: the event as sent, for error answers)."""
        received = time.perf_counter() if received is None else received
        lane_id = getattr(event, "lane", "")
        if isinstance(event, InjectEvent) and event.response_id in self._by_response:
            lane_id = self._by_response[event.response_id].lane.id  # its errors go there
        try:
            if isinstance(event, CreateEvent):
                await self._create(event, received)
            elif isinstance(event, SteerEvent):
                await self._steer(event)
            elif isinstance(event, AppendEvent):
                self._append(event)
            elif isinstance(event, InjectEvent):
                await self._inject(event)
            else:
                self._cancel(event)
        except ApiError as error:
            await self._error(lane_id, error, raw if raw is not None else _answers_for(event))
        except Exception:
            # A server fault, not the client's: logged with its traceback; the client gets a
            # generic 500 without exception text, and the stream goes on.
            self.deps.log.exception("client event failed on a %s stream", self.transport)
            answering = raw if raw is not None else _answers_for(event)
            await self._error(lane_id, server_error(), answering)

    async def _create(self, event: CreateEvent, received: float) -> None:
        actions = self.machine.create(
            event.lane, event.previous_response_id, (dict(event.body), received)
        )
        self._lane(event.lane)
        await self._apply(actions)

    async def _steer(self, event: SteerEvent) -> None:
        if event.problem is not None:
            problem = event.problem
            refused = self.machine.refuse_steer(
                event.previous_response_id, event.input, problem.code, problem.message
            )
            await self._apply([refused])
            return
        await self._apply(self.machine.steer(event.previous_response_id, event.input, event.items))

    def _append(self, event: AppendEvent) -> None:
        ticket = self.machine.running(event.lane)
        run = self._started.get(ticket.number) if ticket is not None else None
        if run is None:
            raise ApiError(
                f"Response '{event.response_id}' is not waiting for tool outputs.",
                code="response_not_waiting",
                param="response_id",
                status=409,
            )
        run.offer_append(event.response_id, event.input)

    async def _inject(self, event: InjectEvent) -> None:
        """``response.inject`` (beta): in append mode, the tool outputs a waiting response
        needs, committed as an append would; acknowledged either way."""
        run = self._by_response.get(event.response_id)
        lane = run.lane.id if run is not None else ""
        if run is None or not run.waiting_for_append:
            known = run is not None or self.machine.has_ended(event.response_id)
            failed: ResponseInjectFailedEvent = {
                "type": "response.inject.failed",
                "response_id": event.response_id,
                "input": list(event.input) if isinstance(event.input, list) else [],
                "error": {
                    "code": "response_already_completed" if known else "response_not_found",
                    "message": f"Response '{event.response_id}' is not waiting for tool outputs."
                    if known
                    else f"No response '{event.response_id}' is active on this connection.",
                },
                "sequence_number": self.machine.next_seq(),
            }
            await self.emit(lane, failed)
            return
        run.offer_append(event.response_id, event.input)
        created: ResponseInjectCreatedEvent = {
            "type": "response.inject.created",
            "response_id": event.response_id,
            "sequence_number": self.machine.next_seq(),
        }
        await self.emit(lane, created)

    def _cancel(self, event: CancelEvent) -> None:
        ticket = self.machine.running(event.lane)
        run = self._started.get(ticket.number) if ticket is not None else None
        if run is None or (event.response_id is not None and event.response_id != run.id):
            raise ApiError(
                f"No in-flight response '{event.response_id or ''}' on this stream to cancel.",
                code="response_not_found",
                param="response_id",
                status=404,
            )
        run.cancel()

    # -- carrying out the machine's actions --------------------------------------------------

    async def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Start):
                self._start(action.ticket)
            elif isinstance(action, Emit):
                await self.emit(action.lane, action.event)
            elif isinstance(action, StopAtBoundary):
                run = self._by_response.get(action.response_id)
                if run is not None:
                    run.stop_at_boundary()

    def _start(self, ticket: Ticket) -> None:
        lane = self._lane(ticket.lane)
        steering = [dict(item) for steer in ticket.steers for item in steer.items]
        explicit_steering: list[Item] = []
        if ticket.successor_of is not None:
            # Inherits the steered response's settings; continues it with the queued input.
            settings = self._successor_settings.pop(ticket.successor_of)
            body = {k: v for k, v in settings.items() if k not in _NOT_INHERITED}
            body["previous_response_id"] = ticket.successor_of
            body["input"] = cast(JSONValue, steering)
            received = time.perf_counter()
        else:
            payload = ticket.payload
            assert isinstance(payload, tuple)
            body, received = payload
            # The queued steering input goes before the explicit continuation's own.
            explicit_steering = cast(list[Item], steering)
        run = ResponseRun(
            self.deps,
            lane,
            body,
            _LaneEmit(self, ticket.lane),
            self.transport,
            received,
            caller=self.caller,
            hooks=self,
            steering=explicit_steering,
            streaming=self.streaming,
        )
        self._started[ticket.number] = run
        self._ticket_of[run] = ticket
        lane.inflight = run
        task = asyncio.get_running_loop().create_task(run.run(), name=f"response {run.id}")
        run.task = task
        self._runs.add(task)
        task.add_done_callback(self._runs.discard)
        # Called however the task ends, even when cancelled before it ever ran.
        task.add_done_callback(partial(self._ended, run, ticket))

    def _ended(self, run: ResponseRun, ticket: Ticket, task: asyncio.Task[None]) -> None:
        """A run's task is done (however it ended, even cancelled before it ever ran): act on
        what the machine answered to its end, after the run's own last event."""
        actions = self._settle(run, ticket)
        self._out.release(ticket.lane)  # a step held by the run ends with it
        del self._started[ticket.number]
        del self._ticket_of[run]
        if actions and not self._stopping:
            follow_up = asyncio.get_running_loop().create_task(self._apply(actions))
            self._runs.add(follow_up)
            follow_up.add_done_callback(self._runs.discard)

    def _settle(self, run: ResponseRun, ticket: Ticket) -> list[Action]:
        """Tell the machine how ``run`` ended (once); the actions it answered."""
        if ticket.number in self._settled:
            return self._settled.pop(ticket.number)
        status = _status_of(run)
        required = run.required_input
        if (
            status in ("completed", "incomplete")
            and not required
            and self.machine.has_pending(run.id)
        ):
            # The machine starts its automatic successor, with these settings.
            self._successor_settings[run.id] = dict(run.body)
        # A parent that is gone (neither cached nor stored) can take no continuation any more.
        lost = run.refusal == "previous_response_not_found"
        actions = self.machine.ended(ticket.number, status, required, parent_lost=lost)
        self._by_response.pop(run.id, None)
        if run.lane.inflight is run:
            run.lane.inflight = None
        return actions

    # -- what runs report (runner.RunHooks) --------------------------------------------------

    def created(self, run: ResponseRun) -> None:
        self._by_response[run.id] = run
        self.machine.created(self._ticket_of[run].number, run.id)

    def ending(self, run: ResponseRun) -> None:
        # Its terminal event goes out next: from now on a steer finds it finished, and what
        # follows it (a successor, steer.pending) is sent once the run's task is done.
        ticket = self._ticket_of[run]
        self._settled[ticket.number] = self._settle(run, ticket)

    async def waiting(self, run: ResponseRun, calls: list[FunctionCallItem]) -> None:
        stubs = [
            {"type": "function_call_output", "call_id": call["call_id"], "name": call["name"]}
            for call in calls
        ]
        await self._apply(self.machine.waiting(run.id, stubs))  # type: ignore[arg-type]

    def resumed(self, run: ResponseRun) -> list[Item]:
        steers = self.machine.resumed(run.id)
        return [item for steer in steers for item in steer.items]  # type: ignore[misc]


class _LaneEmit:
    """A run's way to emit on its lane; ``hold`` marks that more of the step follows at once
    (streaming.py calls it when an engine segment finished)."""

    __slots__ = ("_lane", "_session")

    def __init__(self, session: Session, lane: str) -> None:
        self._session = session
        self._lane = lane

    async def __call__(self, data: ServerEvent) -> None:
        await self._session.emit(self._lane, data)

    def hold(self) -> None:
        self._session.hold(self._lane)


def _status_of(run: ResponseRun) -> RunStatus:
    """How a run ended, as the lane machine counts it."""
    record = run.record
    if not run.created_sent or record is None:
        return "refused"
    status = record.status
    if status == "completed" or status == "incomplete" or status == "failed":
        return status
    return "cancelled"  # by the client, or cut short with its stream


def _answers_for(event: ClientEvent) -> JSONObject:
    """The ``answers_to`` shape of a typed event (for a decoder that has no JSON form)."""
    if isinstance(event, CreateEvent):
        return {"type": "response.create", **event.body}
    if isinstance(event, AppendEvent):
        return {"type": "response.append", "response_id": event.response_id}
    if isinstance(event, CancelEvent):
        return {"type": "response.cancel", "response_id": event.response_id}
    if isinstance(event, InjectEvent):
        return {"type": "response.inject", "response_id": event.response_id}
    return {"type": "response.steer", "previous_response_id": event.previous_response_id}
