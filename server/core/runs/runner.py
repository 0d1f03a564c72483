"""One response, from request to terminal event: pre-inference, sampling, post-inference.

The runner is where the per-stream cache pays off. With a cached predecessor it validates,
classifies and renders only the new input and appends the tokens to the cached ones; without
one (a stateless request, or a continuation resolved from the durable store) the same stages
run over the whole history. Both paths share this code, so the comparison measures only what
the state changes. The steps live beside it: ``continuation`` (the base state and prefix),
``prompt`` (checking and rendering what joins the conversation), ``streaming`` (the engine
segment), ``append`` (append mode), ``account`` (what the run counts), ``terminal`` (its end:
cache, durable rows, terminal event). A run gets the core's
parts it uses as one typed bundle (``deps.RunDeps``), never the core itself.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from bidi_responses.schema import (
    ErrorObject,
    FunctionCallItem,
    Item,
    JSONObject,
    JSONValue,
    Outcome,
    RequiredInputStub,
    ResponseCreatedEvent,
    ResponseDoneEvent,
    ResponseError,
    ResponseInProgressEvent,
    ResponseObject,
)

from ...config import StreamingConfig
from ..api.client_events import answering
from ..api.errors import ApiError
from ..api.ids import new_id
from ..api.requests import CreateRequest
from ..conversation.state import ConversationState
from ..observability.metrics import ResponseMetrics
from ..ports import EngineError, EngineFinish
from ..storage.idempotency import find_replay
from ..tenancy.caller import ANONYMOUS, Caller
from . import continuation, terminal
from .account import RunAccount
from .append import AppendWait
from .deps import RunDeps
from .lane import Lane
from .offload import item_chars, request_chars
from .output_items import Emit, ItemStreamer
from .prompt import Prompt
from .record import (
    EventSequence,
    ResponseRecord,
    error_event,
    terminal_event,
)
from .routing import Route
from .streaming import BoundaryStop, engine_request_for, stream_segment


def output_stubs(calls: list[FunctionCallItem]) -> list[RequiredInputStub]:
    """The stubs of the tool outputs that answer ``calls`` (``response.steer.pending``'s
    ``required_input``)."""
    return [
        {"type": "function_call_output", "call_id": call["call_id"], "name": call["name"]}
        for call in calls
    ]


class RunHooks(Protocol):
    """What a run tells the stream that owns its lane (``session.Session``)."""

    def created(self, run: ResponseRun) -> None:
        """The run is about to send its ``response.created``."""

    def ending(self, run: ResponseRun) -> None:
        """The run is about to send its terminal event."""

    async def waiting(self, run: ResponseRun, calls: list[FunctionCallItem]) -> None:
        """The run sent ``response.done`` and waits for the client's tool outputs."""

    def resumed(self, run: ResponseRun) -> list[Item]:
        """Tool outputs were accepted; the steering input to put before them."""


class ResponseRun:
    """Runs one response on a lane and emits its events."""

    def __init__(
        self,
        deps: RunDeps,
        lane: Lane,
        create: CreateRequest | JSONObject,
        emit: Emit,
        transport: str,
        received: float,
        *,
        caller: Caller = ANONYMOUS,
        hooks: RunHooks | None = None,
        steering: list[Item] | None = None,
        streaming: StreamingConfig | None = None,
        event_id: str | None = None,
    ) -> None:
        self.deps = deps
        # How engine output becomes deltas (the stream's delta window, if its client chose one).
        self.streaming = streaming or deps.config.streaming
        self.lane = lane
        self.hooks = hooks
        # Queued steering input this explicit continuation commits, before its own input (named
        # ``steering[i]`` in errors, so the client's own items keep their indices).
        self.steering = steering or []
        # Steering: stop at the next output boundary once requested.
        self.stop = BoundaryStop()
        # Set once response.created went out (the response exists for the client).
        self.created_sent = False
        # The client tool calls the response ended with (those a continuation must answer).
        self.open_calls: list[FunctionCallItem] = []
        # The error code that refused the create before its response.created, if one did.
        self.refusal: str | None = None
        # Who asked: owns the response (tenant), is counted by the limits and the ledger.
        self.caller = caller
        self.tenant = caller.tenant
        self.quota_key = caller.quota_key
        # The create: typed when it arrived (a stream's lane checked it then), or the body as
        # sent (checked by ``run``, after the admission checks, so those are said first).
        self.request = create if isinstance(create, CreateRequest) else None
        self.body: JSONObject = {} if isinstance(create, CreateRequest) else create
        if self.request is None:
            event_id = self.body.pop("event_id", None)
        # Client event id, echoed by an error about this request.
        self.event_id = event_id if isinstance(event_id, str) else None
        model = self.request.model if self.request else self.body.get("model")
        self.emit = emit
        self.transport = transport
        self.id = new_id("resp")
        self.task: asyncio.Task[None] | None = None
        self.record: ResponseRecord | None = None
        self.state: ConversationState | None = None
        self.seq = EventSequence()
        self.appends = AppendWait()
        self._cancel_reason: str | None = None
        self.account = RunAccount(received, caller, transport)
        self.route: Route | None = None
        # The conversation it renders, once its base and route are known (``_prepare``).
        self.prompt: Prompt | None = None
        # The structured-output format in canonical form, taken once for every segment.
        self.output_format: JSONObject | None = None
        self.metrics = ResponseMetrics(deps.metrics, transport, model, received)

    @property
    def answers(self) -> dict[str, str | None]:
        """What an error about this create says it answers (see ``error_event``)."""
        request = self.request
        previous = (
            request.previous_response_id if request else self.body.get("previous_response_id")
        )
        return answering(
            "response.create", self.event_id, previous if isinstance(previous, str) else None
        )

    # -- control from the session ------------------------------------------------------------

    @property
    def waiting_for_append(self) -> bool:
        """True while the response sits in ``response.done`` waiting for tool outputs."""
        return self.appends.waiting

    def offer_append(self, response_id: str, raw_input: JSONValue) -> None:
        """Hand tool outputs to the waiting response; ApiError if they do not fit."""
        limits = self.deps.config.limits
        self.appends.offer(self.id, response_id, raw_input, limits, self._take_steering)

    def _take_steering(self) -> list[Item]:
        """The steering input an accepted append commits, put before the tool outputs."""
        steering = self.hooks.resumed(self) if self.hooks is not None else []
        if steering:
            self.stop.clear()
        return steering

    def stop_at_boundary(self) -> None:
        """Steered: stop once the output item being generated is done (never inside it)."""
        self.stop.request()

    @property
    def required_input(self) -> list[RequiredInputStub]:
        """Stubs of the client tool outputs a continuation of this response must carry."""
        return output_stubs(self.open_calls)

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop the response promptly; it ends as incomplete with ``reason``. Once only: a
        second cancel must not cut short the first one's ending. Before its
        ``response.created`` the response still gets one, then ends at once: the client
        always sees a cancelled create begin and end."""
        if self._cancel_reason is not None or self.task is None or self.task.done():
            return
        self._cancel_reason = reason
        if self.created_sent:
            self.task.cancel()

    # -- the run -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Run to a terminal event (or an error event if the request is rejected)."""
        deps = self.deps
        self.metrics.arrived()
        try:
            try:
                deps.state.admit()
                deps.limiter.admit_request(self.quota_key)
                request = self.request or self.lane.parse(self.body, deps.config.limits)
                if request.idempotency_key is not None and await self._replayed(request):
                    return
                deps.post.admit(request.store)  # 503 storage_unavailable while the disk is down
                self.record = ResponseRecord(id=self.id, request=request)
                await self._prepare(request)
            except ApiError as error:
                self.state = None  # a failed continuation drops what it referenced
                self.refusal = error.code
                await self.emit(error_event(error.status, error.to_error_object(), self.answers))
                return
            deps.state.inflight[self.id] = self
            await self._respond(request)
        except asyncio.CancelledError:
            if self._cancel_reason is None or self.record is None:
                # The stream went away (client gone, or the server stopping after its grace
                # period): no terminal event can be sent, but a started response still gets
                # its ledger row, so usage is never lost.
                self._abandon()
                raise
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
            # Cancelled by the client: end the response as incomplete; the stream goes on.
            self.record.status = "cancelled"
            try:
                await self._finish("incomplete", reason=self._cancel_reason)
            except asyncio.CancelledError:
                self._abandon()  # and then the stream went away: its usage is still kept
                raise
        except EngineError as exc:  # the inference backend failed: fail this response only
            deps.log.warning("response %s failed: %s: %s", self.id, exc.code, exc)
            failure: ResponseError = {"code": exc.code, "message": str(exc)}
            if self.record is None or not self.account.started:
                upstream: ErrorObject = {
                    "type": "server_error",
                    "code": failure["code"],
                    "message": failure["message"],
                    "param": None,
                }
                await self.emit(error_event(502, upstream))
            else:
                self.record.error = failure
                await self._finish("failed")
        except Exception:  # an engine or pipeline bug: fail this response only
            deps.log.exception("response %s failed", self.id)
            if self.record is None or not self.account.started:
                internal = ApiError(
                    "The server had an error processing the request.",
                    code="server_error",
                    status=500,
                    type="server_error",
                )
                await self.emit(error_event(500, internal.to_error_object(), self.answers))
            else:
                # Logged above with its traceback; the client never sees exception text.
                self.record.error = {
                    "code": "server_error",
                    "message": "The server had an error processing your request.",
                }
                await self._finish("failed")
        finally:
            if deps.state.inflight.get(self.id) is self:
                del deps.state.inflight[self.id]
            if self.lane.inflight is self:
                self.lane.inflight = None

    async def _finish(self, outcome: Outcome, reason: str | None = None) -> None:
        """End the response with its terminal event (``terminal.finish``); the lane is free
        for its next response from here on."""
        assert self.record is not None
        if self.lane.inflight is self:
            self.lane.inflight = None
        await terminal.finish(
            self.deps,
            self.lane,
            self.record,
            self.account,
            self.state,
            self.metrics,
            self._announce,
            outcome,
            reason,
        )

    async def _announce(self, outcome: Outcome, snapshot: ResponseObject) -> None:
        """Tell the stream, then the client, that the response ended."""
        if self.hooks is not None:
            self.hooks.ending(self)
        await self.emit(terminal_event(outcome, snapshot, self.seq.take()))

    def _abandon(self) -> None:
        """The stream went away: keep the started response's usage (``terminal.abandon``)."""
        terminal.abandon(self.deps, self.record, self.account, self.state, self.metrics)

    async def _replayed(self, request: CreateRequest) -> bool:
        """Take the response id the idempotency key names; if that response already exists,
        send its terminal event again and return True (the turn does not run twice)."""
        deps = self.deps
        self.id, stored = await find_replay(deps.store, deps.state.inflight, request, self.caller)
        if stored is None:
            return False
        self.deps.state.failover["idempotent_replays"] += 1
        status = stored.response.get("status")
        replayed: Outcome = "incomplete" if status == "incomplete" else "completed"
        await self.emit(terminal_event(replayed, stored.response, self.seq.take()))
        return True

    async def _prepare(self, request: CreateRequest) -> None:
        """Pre-inference: resolve the base state, route, check, classify and render."""
        deps = self.deps
        assert self.record is not None
        stats = self.record.stats
        stats.pre_inference_runs += 1
        # cached_tokens is the prefix of this prompt that the previous response's context
        # shares, however its state was found.
        base = await continuation.resolve(
            deps,
            self.lane,
            self.tenant,
            request.previous_response_id,
            request.toolset.function_names,
        )
        self.state = base.state
        history = base.history
        limits = deps.config.limits
        size = request_chars(request, limits) + (item_chars(history) if history else 0)

        self.route, stats.route_resolved = self.lane.route(deps.router, request.model)

        # The route's engine may need its model's own prompt format (e.g. Harmony for gpt-oss).
        renderer = getattr(self.route.engine, "renderer", None) or deps.renderer
        self.output_format = request.output_format()
        self.prompt = Prompt(deps, self.record, self.account, base.state, renderer)
        await self.prompt.build(base, size, self.steering, self.output_format)

    async def _respond(self, request: CreateRequest) -> None:
        assert self.record is not None and self.state is not None
        record = self.record
        if request.background:
            record.status = "queued"
        if self.hooks is not None:
            self.hooks.created(self)
        self.created_sent = True
        await self.emit(
            ResponseCreatedEvent(
                type="response.created",
                response=record.snapshot(),
                sequence_number=self.seq.take(),
            )
        )
        record.status = "in_progress"
        self.account.started = True
        if self._cancel_reason is not None:  # cancelled while it was being prepared
            record.status = "cancelled"
            await self._finish("incomplete", reason=self._cancel_reason)
            return
        if not request.generate:
            self.account.skipped_engine(record.stats, len(self.state.tokens))
            await self._finish("completed")
            return
        await self.emit(
            ResponseInProgressEvent(
                type="response.in_progress",
                response=record.snapshot(),
                sequence_number=self.seq.take(),
            )
        )
        budget = request.max_output_tokens
        while True:
            segment, calls = await self._sample(budget, request)
            if budget is not None:
                budget -= segment.output_tokens
            if segment.reason == "max_output_tokens":
                await self._finish("incomplete", reason="max_output_tokens")
                return
            if not (request.append_mode and calls):
                if calls:
                    self.open_calls = calls
                elif segment.reason == "steered":
                    # Stopped between items for the steering input; its successor follows.
                    await self._finish("incomplete", reason="steered")
                    return
                break
            appended = await self._wait_for_append(calls)
            if appended is None:
                await self._finish("incomplete", reason="append_timeout")
                return
            if budget is not None and budget < 16:
                await self._finish("incomplete", reason="max_output_tokens")
                return
        await self._finish("completed")

    async def _wait_for_append(self, calls: list[FunctionCallItem]) -> list[Item] | None:
        """Send response.done and wait for a matching append; None on timeout."""
        prompt = self.prompt
        assert self.record is not None and prompt is not None
        self.appends.expect(calls)
        timeout = 0.0 if self.lane.input_closed else self.deps.config.limits.append_timeout_s
        deadline = time.monotonic() + timeout
        await self.emit(
            ResponseDoneEvent(
                type="response.done",
                response=self.record.snapshot(),
                pending_calls=list(calls),
                sequence_number=self.seq.take(),
            )
        )
        if self.hooks is not None:
            await self.hooks.waiting(self, calls)
        return await self.appends.wait(self.id, prompt, self.emit, deadline)

    async def _sample(
        self, budget: int | None, request: CreateRequest
    ) -> tuple[EngineFinish, list[FunctionCallItem]]:
        """Run one engine segment, streaming its items; returns the finish and its calls."""
        assert self.record is not None and self.state is not None and self.prompt is not None
        state = self.state
        record = self.record
        stats = record.stats
        engine_request = engine_request_for(
            request,
            state,
            budget,
            self.lane.affinity,
            self.output_format,
            self.streaming.coalesce_deltas,
        )
        self.account.segment_starts(stats, len(state.tokens))
        streamer = ItemStreamer(self.emit, self.seq, record, self.metrics.first_delta)
        assert self.route is not None
        try:
            segment = await stream_segment(
                self.route.engine,
                engine_request,
                streamer,
                self.streaming,
                self.stop,
            )
        except BaseException:
            # Cut short: what was streamed still counts.
            self.account.usage.output_tokens += streamer.tokens
            raise
        self.account.segment_ends(stats, segment)
        self.metrics.engine_segment(segment.extra)
        items = streamer.items
        await self.prompt.add_output(items)
        calls = [item for item in items if item["type"] == "function_call"]
        return segment, calls
