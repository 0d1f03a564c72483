"""A stream's session: the owner of its lanes, caches, in-flight responses and limits.

Transports create one Session per Connect call or WebSocket connection, feed it client events
as JSON-shaped dicts (``handle``) and write out what it produces (``events``). The session
never raises into the transport: a bad event becomes an ``error`` event and the stream goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from functools import partial
from typing import TYPE_CHECKING

from bidi_responses.server.core import continuation
from bidi_responses.server.core.errors import ApiError, server_error
from bidi_responses.server.core.event_types import ServerEvent, WarningEvent
from bidi_responses.server.core.events import OutEvent, answers_to, error_event
from bidi_responses.server.core.items import JSONObject, JSONValue
from bidi_responses.server.core.jsonshape import check_json_shape
from bidi_responses.server.core.lane import Lane
from bidi_responses.server.core.runner import ResponseRun
from bidi_responses.server.core.state import ResponseCache

if TYPE_CHECKING:
    from bidi_responses.server.core.service import ResponsesCore

_STREAM_ID = re.compile(r"[A-Za-z0-9_.-]{1,256}")
CLIENT_EVENT_TYPES = ("response.create", "response.append", "response.cancel")


class Session:
    """One stream (Connect call, WebSocket connection, or a one-shot stateless call)."""

    def __init__(
        self,
        core: ResponsesCore,
        transport: str,
        *,
        stateful: bool = True,
        tenant: str | None = None,
        quota_key: str = "anonymous",
    ) -> None:
        self.core = core
        self.quota_key = quota_key
        self.transport = transport
        self.stateful = stateful
        # The authenticated tenant (None on an open server): owns what this stream creates.
        self.tenant = tenant
        # Why the server ended the stream (age limit, drain), for the transport's final status.
        self.end_error: ApiError | None = None
        limits = core.config.limits
        self._out: asyncio.Queue[OutEvent | None] = asyncio.Queue(limits.outbound_queue_events)
        self._lanes: dict[str, Lane] = {}
        self._runs: set[asyncio.Task[None]] = set()
        self._watchdog: asyncio.Task[None] | None = None
        self._closed = False
        self.opened_at = time.monotonic()

    # -- lifecycle ---------------------------------------------------------------------------

    def start_age_limit(self) -> None:
        """Warn before, and end the stream at, the configured connection age limit."""
        self._watchdog = asyncio.get_running_loop().create_task(self._age_limit())

    async def _age_limit(self) -> None:
        limits = self.core.config.limits
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
            run = lane.inflight
            if run is not None and run.waiting_for_append:
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
        if self.core.state_tier is None or not self.stateful:
            return
        states = []
        for lane in self._lanes.values():
            if lane.cache is None or lane.inflight is not None:
                continue
            for response_id, state in lane.cache.entries():
                if state.stored_chain:  # the store has the chain this state renders
                    states.append((response_id, state))
        await continuation.save_states(self.core, states)

    async def close(self) -> None:
        """The client is gone: stop in-flight engine work and drop the caches."""
        if self._closed:
            return
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        await self._stop_runs()
        for lane in self._lanes.values():
            if lane.cache is not None:
                lane.cache.clear()
            await lane.affinity.aclose()
        self.core.metrics.open_lanes.dec(len(self._lanes))
        self._lanes.clear()

    async def _stop_runs(self) -> None:
        runs = list(self._runs)
        for task in runs:
            task.cancel()
        if runs:
            await asyncio.gather(*runs, return_exceptions=True)

    async def events(self) -> AsyncIterator[OutEvent]:
        """Server events in order, until the session finishes."""
        while True:
            event = await self._out.get()
            if event is None:
                return
            yield event

    async def event_batches(self, max_events: int) -> AsyncIterator[list[OutEvent]]:
        """Server events in order, as lists of what is ready when the transport asks.

        Waits only for the first event of a list; the rest are the events already queued
        behind it (at most ``max_events`` in all). Nothing is held back to fill a list.
        """
        queue = self._out
        while True:
            first = await queue.get()
            if first is None:
                return
            batch = [first]
            ended = False
            while len(batch) < max_events and not queue.empty():
                event = queue.get_nowait()
                if event is None:
                    ended = True
                    break
                batch.append(event)
            yield batch
            if ended:
                return

    # -- client events -----------------------------------------------------------------------

    def _lane(self, lane_id: str) -> Lane:
        lane = self._lanes.get(lane_id)
        if lane is None:
            limits = self.core.config.limits
            if len(self._lanes) >= limits.max_lanes:
                raise ApiError(
                    f"Invalid 'stream_id': at most {limits.max_lanes} lanes per connection.",
                    code="too_many_lanes",
                    param="stream_id",
                )
            cache_config = self.core.config.cache
            cache = (
                ResponseCache(
                    cache_config.max_responses, cache_config.max_bytes, self.core.cache_budget
                )
                if self.stateful
                else None
            )
            lane = self._lanes[lane_id] = Lane(lane_id, cache)
            self.core.metrics.open_lanes.inc()
        return lane

    async def emit(self, lane: str, data: ServerEvent) -> None:
        """Queue a server event for the transport (waits while the client is slow)."""
        if data["type"] == "error":
            self.core.metrics.error(self.transport, data["status"], data["error"]["code"])
        await self._out.put(OutEvent(lane, data))

    async def _error(self, lane: str, error: ApiError, event: JSONValue = None) -> None:
        await self.emit(lane, error_event(error.status, error.to_error_object(), answers_to(event)))

    async def handle(self, event: JSONValue, received: float | None = None) -> None:
        """Act on one client event; problems become error events on the stream."""
        received = time.perf_counter() if received is None else received
        lane_id = ""
        try:
            if not isinstance(event, dict):
                raise ApiError("Each client event must be a JSON object.", code="invalid_type")
            # Nesting and numbers first: every later step may then walk the event freely.
            check_json_shape(event)
            raw_lane = event.get("stream_id")
            if raw_lane is not None and not isinstance(raw_lane, str):
                raise ApiError(
                    "Invalid 'stream_id': expected a string.",
                    code="invalid_type",
                    param="stream_id",
                )
            if raw_lane and not _STREAM_ID.fullmatch(raw_lane):
                # The hosted WebSocket mode's rule; "" stays the default lane (proto3 default).
                raise ApiError(
                    "Invalid 'stream_id': expected 1 to 256 characters of [A-Za-z0-9_.-].",
                    code="invalid_stream_id",
                    param="stream_id",
                )
            lane_id = raw_lane or ""
            kind = event.get("type")
            if kind == "response.create":
                await self._create(lane_id, event, received)
            elif kind == "response.append":
                self._append(lane_id, event)
            elif kind == "response.cancel":
                self._cancel(lane_id, event)
            elif kind is None:
                raise ApiError(
                    "Missing required parameter: 'type'.",
                    code="missing_required_parameter",
                    param="type",
                )
            elif not isinstance(kind, str):
                raise ApiError(
                    f"Invalid 'type': expected a string, got {type(kind).__name__}.",
                    code="invalid_type",
                    param="type",
                )
            else:
                raise ApiError(
                    f"Invalid 'type': unknown client event '{kind}' (expected one of "
                    f"{', '.join(CLIENT_EVENT_TYPES)}).",
                    code="unknown_event_type",
                    param="type",
                )
        except ApiError as error:
            await self._error(lane_id, error, event)
        except Exception:
            # A server fault, not the client's: logged with its traceback; the client gets a
            # generic 500 without exception text, and the stream goes on.
            self.core.log.exception("client event failed on a %s stream", self.transport)
            await self._error(lane_id, server_error(), event)

    async def _create(self, lane_id: str, event: JSONObject, received: float) -> None:
        lane = self._lane(lane_id)
        if lane.inflight is not None:
            raise ApiError(
                f"Conversation already has an active response ('{lane.inflight.id}'); wait for "
                "its terminal event or cancel it before creating another.",
                code="conversation_already_has_active_response",
            )
        body = {k: v for k, v in event.items() if k not in ("type", "stream_id")}
        run = ResponseRun(
            self.core,
            lane,
            body,
            partial(self.emit, lane_id),
            self.transport,
            received,
            tenant=self.tenant,
            quota_key=self.quota_key,
        )
        lane.inflight = run
        task = asyncio.get_running_loop().create_task(run.run(), name=f"response {run.id}")
        run.task = task
        self._runs.add(task)
        task.add_done_callback(self._runs.discard)

    def _append(self, lane_id: str, event: JSONObject) -> None:
        lane = self._lanes.get(lane_id)
        response_id = event.get("response_id")
        if not isinstance(response_id, str) or not response_id:
            raise ApiError(
                "Missing required parameter: 'response_id'.",
                code="missing_required_parameter",
                param="response_id",
            )
        run = lane.inflight if lane is not None else None
        if run is None:
            raise ApiError(
                f"Response '{response_id}' is not waiting for tool outputs.",
                code="response_not_waiting",
                param="response_id",
                status=409,
            )
        run.offer_append(response_id, event.get("input"))

    def _cancel(self, lane_id: str, event: JSONObject) -> None:
        lane = self._lanes.get(lane_id)
        response_id = event.get("response_id") or None
        run = lane.inflight if lane is not None else None
        if run is None or (response_id is not None and response_id != run.id):
            raise ApiError(
                f"No in-flight response '{response_id or ''}' on this stream to cancel.",
                code="response_not_found",
                param="response_id",
                status=404,
            )
        run.cancel()
