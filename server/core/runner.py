"""One response, from request to terminal event: pre-inference, sampling, post-inference.

The runner is where the per-stream cache pays off. With a cached predecessor it validates,
classifies and renders only the new input and appends the tokens to the cached ones; without
one (a stateless request, or a continuation resolved from the durable store) the same stages
run over the whole history. Both paths share this code, so the comparison measures only what
the state changes.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from bidi_responses.server.core.errors import ApiError, previous_response_not_found
from bidi_responses.server.core.events import (
    EventSequence,
    ResponseRecord,
    Usage,
    error_event,
)
from bidi_responses.server.core.handoff import decode_state, encode_state
from bidi_responses.server.core.idempotency import check_key, idempotent_response_id
from bidi_responses.server.core.ids import new_id
from bidi_responses.server.core.jsonshape import canonical_json
from bidi_responses.server.core.lane import Lane
from bidi_responses.server.core.params import response_format
from bidi_responses.server.core.render import Renderer, TokenArray
from bidi_responses.server.core.requests import (
    CreateRequest,
    Item,
    parse_create,
    parse_input,
)
from bidi_responses.server.core.state import (
    ConversationState,
    common_prefix,
    object_bytes,
    observe,
)
from bidi_responses.server.core.store import LedgerRow, StoredResponse
from bidi_responses.server.core.streaming import Emit, ItemStreamer, stream_segment
from bidi_responses.server.engines.base import (
    EngineConversation,
    EngineError,
    EngineFinish,
    EngineRequest,
    FunctionSpec,
)
from bidi_responses.server.pipeline.base import StageCounters, StageInput
from bidi_responses.server.pipeline.post import PostJob, StorageUnavailable
from bidi_responses.server.pipeline.routing import Route

if TYPE_CHECKING:
    from bidi_responses.server.core.service import ResponsesCore


_ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "compaction": "cmp",
}


class ResponseRun:
    """Runs one response on a lane and emits its events."""

    def __init__(
        self,
        core: ResponsesCore,
        lane: Lane,
        body: dict[str, Any],
        emit: Emit,
        transport: str,
        received: float,
        *,
        tenant: str | None = None,
        quota_key: str = "anonymous",
    ) -> None:
        self.core = core
        self.lane = lane
        self.tenant = tenant
        self.quota_key = quota_key
        # Client event id, echoed by an error about this request.
        event_id = body.pop("event_id", None)
        self.event_id = event_id if isinstance(event_id, str) else None
        self.body = body
        self.emit = emit
        self.transport = transport
        self.received = received
        self.id = new_id("resp")
        self.task: asyncio.Task[None] | None = None
        self.record: ResponseRecord | None = None
        self.state: ConversationState | None = None
        self.seq = EventSequence()
        self.pending_calls: dict[str, Item] = {}
        self._append_waiter: asyncio.Future[list[Item]] | None = None
        self._cancel_reason: str | None = None
        self._counters = StageCounters(items={}, ms={})
        self._usage = Usage()
        self._engine_end = 0.0
        self._started = False
        self._posted = False
        self._inputs: list[Item] = []
        self.route: Route | None = None
        self.renderer: Renderer = core.renderer
        self.model_label = "unknown"
        self._ttft_seen = False

    @property
    def answers(self) -> dict[str, Any]:
        """What an error about this create says it answers (see ``error_event``)."""
        previous = self.body.get("previous_response_id")
        return {
            "request_type": "response.create",
            "event_id": self.event_id,
            "response_id": previous if isinstance(previous, str) else None,
        }

    # -- control from the session ------------------------------------------------------------

    @property
    def waiting_for_append(self) -> bool:
        """True while the response sits in ``response.done`` waiting for tool outputs."""
        return self._append_waiter is not None and not self._append_waiter.done()

    def offer_append(self, response_id: str, raw_input: Any) -> None:
        """Hand tool outputs to the waiting response; ApiError if they do not fit."""
        if not self.waiting_for_append or response_id != self.id:
            raise ApiError(
                f"Response '{response_id}' is not waiting for tool outputs.",
                code="response_not_waiting",
                param="response_id",
                status=409,
            )
        items, _ = parse_input(raw_input, self.core.config.limits)
        outputs = [(i, it) for i, it in enumerate(items) if it["type"] == "function_call_output"]
        answered = [it["call_id"] for _, it in outputs]
        for index, item in outputs:
            if item["call_id"] not in self.pending_calls:
                raise ApiError(
                    f"Invalid 'input[{index}].call_id': '{item['call_id']}' is not a pending call "
                    f"of response '{self.id}' (pending: {', '.join(self.pending_calls)}).",
                    code="call_id_mismatch",
                    param=f"input[{index}].call_id",
                )
        missing = [c for c in self.pending_calls if c not in answered]
        if missing or len(answered) != len(set(answered)):
            raise ApiError(
                f"Invalid 'input': the append must answer each pending call exactly once; "
                f"missing or repeated: {', '.join(missing) or 'repeated call_id'}.",
                code="call_id_mismatch",
                param="input",
            )
        assert self._append_waiter is not None
        self._append_waiter.set_result(items)

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop the response promptly; it ends as incomplete with ``reason``."""
        if self.task is not None and not self.task.done():
            self._cancel_reason = reason
            self.task.cancel()

    # -- the run -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Run to a terminal event (or an error event if the request is rejected)."""
        core = self.core
        self.model_label = core.metrics.model(self.body.get("model"))
        core.metrics.requests.labels(self.transport, self.model_label).inc()
        try:
            try:
                if core.draining:
                    raise ApiError(
                        "The server is shutting down and takes no new responses; "
                        "retry on a new connection.",
                        code="server_shutting_down",
                        status=503,
                        type="server_error",
                    )
                core.limiter.admit_request(self.quota_key)
                request = self._parse()
                if request.idempotency_key is not None and await self._replayed(request):
                    return
                core.post.admit(request.store)  # 503 storage_unavailable while the disk is down
                self.record = ResponseRecord(id=self.id, request=request)
                await self._prepare(request)
            except ApiError as error:
                self.state = None  # a failed continuation drops what it referenced
                await self.emit(error_event(error.status, error.to_error_object(), self.answers))
                return
            core.inflight[self.id] = self
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
            await self._finish("incomplete", reason=self._cancel_reason)
        except EngineError as exc:  # the inference backend failed: fail this response only
            core.log.warning("response %s failed: %s: %s", self.id, exc.code, exc)
            failure = {"code": exc.code, "message": str(exc)}
            if self.record is None or not self._started:
                await self.emit(
                    error_event(502, {"type": "server_error", **failure, "param": None})
                )
            else:
                self.record.error = failure
                await self._finish("failed")
        except Exception:  # an engine or pipeline bug: fail this response only
            core.log.exception("response %s failed", self.id)
            if self.record is None or not self._started:
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
            if core.inflight.get(self.id) is self:
                del core.inflight[self.id]
            if self.lane.inflight is self:
                self.lane.inflight = None

    async def _restore(self, previous: str) -> ConversationState | None:
        """The state a draining replica left for ``previous`` (handoff.py), or None."""
        core = self.core
        assert core.state_tier is not None
        try:
            # Only the owner's own conversation: another tenant's id is not found.
            if await core.store.get(previous, self.tenant) is None:
                return None
            blob = await core.state_tier.take_state(previous)
            if blob is None:
                return None
            state = decode_state(blob)
        except Exception:  # unreadable or unreachable: rebuild from the stored chain
            core.log.exception("conversation state of %s not restored", previous)
            return None
        core.failover["states_restored"] += 1
        return state

    async def _hand_off(self, state: ConversationState) -> None:
        """The server is draining: leave this conversation's state for the replica that gets
        its next turn, before the terminal event lets the client move (handoff.py)."""
        tier = self.core.state_tier
        if tier is None or not self.lane.stateful or not state.stored_chain:
            return
        try:
            await tier.save_states(
                [(self.id, encode_state(state))], self.core.config.store.state_ttl_s
            )
        except Exception:  # the next replica re-renders from the store instead
            self.core.log.exception("conversation state of %s not handed off", self.id)
        else:
            self.core.failover["states_handed_off"] += 1

    async def _replayed(self, request: CreateRequest) -> bool:
        """Take the response id the idempotency key names; if that response already exists,
        send its terminal event again and return True (the turn does not run twice)."""
        assert request.idempotency_key is not None
        # Keyed by the authenticated tenant (the body's user only on an open server), so one
        # tenant's key never names another tenant's response.
        owner = self.tenant or request.user
        self.id = idempotent_response_id(owner, check_key(request.idempotency_key))
        if self.id in self.core.inflight:
            raise ApiError(
                f"A response with this 'idempotency_key' ('{self.id}') is still in progress; "
                "wait for its terminal event.",
                code="idempotent_request_in_progress",
                param="idempotency_key",
                status=409,
            )
        stored = await self.core.store.get(self.id, self.tenant)
        if stored is None:
            return False
        if stored.response.get("previous_response_id") != request.previous_response_id:
            raise ApiError(
                f"'idempotency_key' was already used for response '{self.id}', which continues "
                f"'{stored.response.get('previous_response_id')}', not "
                f"'{request.previous_response_id}'.",
                code="idempotency_key_reused",
                param="idempotency_key",
                status=409,
            )
        self.core.failover["idempotent_replays"] += 1
        status = stored.response.get("status")
        terminal = "response.incomplete" if status == "incomplete" else "response.completed"
        await self.emit(self.seq.event(terminal, response=stored.response))
        return True

    def _parse(self) -> CreateRequest:
        limits = self.core.config.limits
        lane = self.lane
        # The lane's last tool set is reused while the client sends the same tools.
        request = parse_create(self.body, limits, lane.toolset)
        if lane.stateful:
            lane.toolset = request.toolset
        if request.background and lane.stateful:
            # As in the hosted WebSocket mode: a connection's responses are its own turns.
            raise ApiError(
                "Unsupported parameter: 'background': not available on a WebSocket or Connect "
                "stream; use POST /v1/responses.",
                code="unsupported_parameter",
                param="background",
            )
        if request.background and not request.store:
            raise ApiError(
                "Invalid 'background': background mode requires 'store': true.",
                code="invalid_value",
                param="background",
            )
        if request.append_mode and not lane.stateful:
            raise ApiError(
                "'append_mode' needs a Connect stream or a WebSocket connection.",
                code="unsupported_parameter",
                param="append_mode",
            )
        return request

    async def _prepare(self, request: CreateRequest) -> None:
        """Pre-inference: resolve the base state, route, check, classify and render."""
        core = self.core
        assert self.record is not None
        stats = self.record.stats
        stats.pre_inference_runs += 1
        history: list[Item] = []
        reused = 0
        previous = request.previous_response_id
        state: ConversationState | None = None
        # The previous response's whole context (its prompt and output) as tokens, or, for a
        # stored predecessor, the instructions, tools and output format its prompt began with:
        # cached_tokens is the prefix of this prompt that context shares, however the state
        # was found.
        previous_tokens: TokenArray | None = None
        previous_prefix: tuple[str | None, list[dict[str, Any]], Any] | None = None
        if previous is not None:
            if self.lane.cache is not None:
                state = self.lane.cache.take(previous)
            if state is None and core.state_tier is not None:
                state = await self._restore(previous)
            if state is not None:
                previous_tokens = state.tokens
                core.metrics.cache_hits.inc()
            else:
                core.metrics.cache_misses.inc()
                chain = await core.store.chain(previous, self.tenant)
                if chain is None:
                    raise previous_response_not_found(previous)
                for link in chain:
                    history.extend(link.input_items)
                    history.extend(link.response.get("output", ()))
                # Stored items are checked again like any other input: this request has no cache.
                history, _ = parse_input(history, core.config.limits, where="history")
                last = chain[-1].response
                text = last.get("text")
                fmt = response_format(text) if isinstance(text, dict) else None
                previous_prefix = (
                    last.get("instructions"),
                    list(last.get("tools") or ()),
                    canonical_json(fmt) if fmt is not None else None,
                )
        if state is None:
            state = ConversationState()
        self.state = state

        route_key = core.router.route_key(request.model)
        memo = self.lane.route_memo
        if memo is not None and memo[0] == route_key:
            self.route = memo[1]
        else:
            self.route = core.router.resolve(request.model)
            stats.route_resolved = True
            if self.lane.stateful:
                self.lane.route_memo = (route_key, self.route)

        rendered = 0
        fmt = self._format(request)
        # The route's engine may need its model's own prompt format (e.g. Harmony for gpt-oss).
        renderer = getattr(self.route.engine, "renderer", None) or core.renderer
        self.renderer = renderer
        if state.format_name is not None and state.format_name != renderer.format_name:
            # The conversation moved to a model of another format: render it all again.
            state.tokens = renderer.render_prefix(request.instructions, request.tools, fmt)
            state.prefix_len = len(state.tokens)
            state.prefix_key = (request.instructions, request.tools, fmt)
            rendered += state.prefix_len
            rendered += renderer.render_items(state.items, {}, state.tokens)
        state.format_name = renderer.format_name
        key = state.prefix_key
        if (
            key is None
            or key[0] != request.instructions
            or (key[1] is not request.tools and key[1] != request.tools)
            or key[2] != fmt
        ):
            rendered += state.set_prefix(
                renderer,
                request.instructions,
                request.tools,
                (request.instructions, request.tools, fmt),
                fmt,
            )

        for item in request.input:
            if "id" not in item:
                item["id"] = new_id(_ID_PREFIX.get(item["type"], "item"))
        items = history + request.input if history else request.input
        paths = [f"history[{i}]" for i in range(len(history))]
        paths += [f"input[{i}]" for i in range(len(request.input))]
        stats.items_validated = len(items)
        await self._examine(request, items, paths)
        if previous_tokens is not None:
            # Taken after the prefix is rebuilt: changed instructions or tools reuse only the
            # tokens the old and new prompts still share.
            stats.tokens_reused = len(state.tokens) - rendered  # kept without rendering
            reused = common_prefix(previous_tokens, state.tokens)
        history_rendered = self._append_items(history) if history else 0
        if previous_prefix is not None:
            reused = self._stored_reuse(previous_prefix, history_rendered)
        rendered += history_rendered + self._append_items(request.input)
        stats.tokens_rendered += rendered
        self._usage.cached_tokens += reused
        self._inputs.extend(request.input)

    def _stored_reuse(
        self, previous_prefix: tuple[str | None, list[dict[str, Any]], Any], history_tokens: int
    ) -> int:
        """Tokens this prompt shares with a stored predecessor's context (prefix + history)."""
        state = self.state
        assert state is not None
        shared = state.prefix_len + history_tokens
        old_prefix = self.core.renderer.render_prefix(*previous_prefix)
        if old_prefix == state.tokens[: state.prefix_len]:
            return shared
        old_prefix.extend(state.tokens[state.prefix_len : shared])
        return common_prefix(old_prefix, state.tokens[:shared])

    async def _examine(self, request: CreateRequest, items: list[Item], paths: list[str]) -> None:
        assert self.record is not None and self.state is not None
        for item, path in zip(items, paths, strict=True):
            if item["type"] == "compaction":
                self.core.compaction.check(item, path)
        declared = request.toolset.function_names
        batch = StageInput(
            items, paths, request, declared, self.state.call_names, self.state.answered_calls
        )
        flags = await self.core.pipeline.run(batch, self.state.stage_state, self._counters)
        self.record.safety_flags.extend(flag.to_dict() for flag in flags)
        self.record.stats.stage_items = self._counters.items
        self.record.stats.stage_ms = self._counters.ms

    def _append_items(self, items: list[Item]) -> int:
        """Render items onto the conversation's tokens and record them; returns tokens added."""
        state = self.state
        assert state is not None
        added = self.renderer.render_items(items, state.call_names, state.tokens)
        for item in items:
            observe(state, item)
            state.item_bytes += object_bytes(item)
        return added

    async def _respond(self, request: CreateRequest) -> None:
        assert self.record is not None and self.state is not None
        record = self.record
        if request.background:
            record.status = "queued"
        await self.emit(self.seq.event("response.created", response=record.snapshot()))
        record.status = "in_progress"
        self._started = True
        if not request.generate:
            record.stats.api_pre_ms = (time.perf_counter() - self.received) * 1000
            self._usage.input_tokens = len(self.state.tokens)
            self._engine_end = time.perf_counter()
            await self._finish("completed")
            return
        await self.emit(self.seq.event("response.in_progress", response=record.snapshot()))
        functions = request.toolset.functions
        forced = request.tool_choice["name"] if isinstance(request.tool_choice, dict) else None
        mode = request.tool_choice if isinstance(request.tool_choice, str) else "required"
        budget = request.max_output_tokens
        while True:
            finish, calls = await self._sample(functions, mode, forced, budget, request)
            if budget is not None:
                budget -= finish.output_tokens
            if finish.reason == "max_output_tokens":
                await self._finish("incomplete", reason="max_output_tokens")
                return
            if not (request.append_mode and calls):
                break
            appended = await self._wait_for_append(calls)
            if appended is None:
                await self._finish("incomplete", reason="append_timeout")
                return
            if budget is not None and budget < 16:
                await self._finish("incomplete", reason="max_output_tokens")
                return
        await self._finish("completed")

    @staticmethod
    def _format(request: CreateRequest) -> dict[str, Any] | None:
        """The structured-output format in canonical form, so that gRPC (Struct) and JSON
        clients render and sample alike."""
        fmt = response_format(request.text)
        return canonical_json(fmt) if fmt is not None else None

    async def _wait_for_append(self, calls: list[Item]) -> list[Item] | None:
        """Send response.done and wait for a matching append; None on timeout."""
        assert self.record is not None and self.state is not None
        self.pending_calls = {call["call_id"]: call for call in calls}
        timeout = 0.0 if self.lane.input_closed else self.core.config.limits.append_timeout_s
        deadline = time.monotonic() + timeout
        await self.emit(
            self.seq.event(
                "response.done",
                response=self.record.snapshot(),
                pending_calls=list(calls),
            )
        )
        while True:
            loop = asyncio.get_running_loop()
            self._append_waiter = loop.create_future()
            remaining = deadline - time.monotonic()
            try:
                async with asyncio.timeout(max(remaining, 0)):
                    items = await self._append_waiter
            except TimeoutError:
                self._append_waiter = None
                self.pending_calls = {}
                return None
            self._append_waiter = None
            for item in items:
                if "id" not in item:
                    item["id"] = new_id(_ID_PREFIX.get(item["type"], "item"))
            paths = [f"input[{i}]" for i in range(len(items))]
            try:
                await self._examine(self.record.request, items, paths)
            except ApiError as error:
                answers = {"request_type": "response.append", "response_id": self.id}
                await self.emit(error_event(error.status, error.to_error_object(), answers))
                continue  # still waiting for an acceptable append
            self.record.stats.items_validated += len(items)
            reused = len(self.state.tokens)
            self.record.stats.tokens_rendered += self._append_items(items)
            self._usage.cached_tokens += reused
            self._inputs.extend(items)
            self.pending_calls = {}
            return items

    async def _sample(
        self,
        functions: tuple[FunctionSpec, ...],
        mode: str,
        forced: str | None,
        budget: int | None,
        request: CreateRequest,
    ) -> tuple[EngineFinish, list[Item]]:
        """Run one engine segment, streaming its items; returns the finish and its calls."""
        assert self.record is not None and self.state is not None
        state = self.state
        record = self.record
        stats = record.stats
        engine_request = EngineRequest(
            prompt_tokens=state.tokens,
            tools=functions,
            tool_choice=mode,
            forced_function=forced,
            max_output_tokens=budget,
            parallel_tool_calls=request.parallel_tool_calls,
            tool_rounds=state.tool_rounds,
            turn_index=state.model_turns,
            response_format=self._format(request),
            temperature=request.temperature,
            top_p=request.top_p,
            conversation=EngineConversation(
                state.items, request.instructions, request.tools, self.lane.affinity
            ),
        )
        self._usage.input_tokens += len(state.tokens)
        if stats.engine_runs == 0:
            stats.api_pre_ms = (time.perf_counter() - self.received) * 1000
        stats.engine_runs += 1
        streamer = ItemStreamer(self.emit, self.seq, record, self.first_delta)
        assert self.route is not None
        try:
            finish = await stream_segment(
                self.route.engine, engine_request, streamer, self.core.config.streaming
            )
        except BaseException:
            self._usage.output_tokens += streamer.tokens
            raise
        self._engine_end = time.perf_counter()
        stats.engine_ms += finish.engine_seconds * 1000
        stats.prefill_tokens += finish.prefill_tokens
        stats.engine_prompt_tokens += finish.prompt_tokens
        stats.engine_cached_tokens += finish.cached_tokens
        self._usage.output_tokens += finish.output_tokens
        items = streamer.items
        stats.tokens_rendered += self._append_items(items)
        calls = [item for item in items if item["type"] == "function_call"]
        return finish, calls

    async def _finish(self, outcome: str, reason: str | None = None) -> None:
        """Post-inference: cache the state, queue ledger/store writes, send the terminal event."""
        assert self.record is not None
        core = self.core
        record = self.record
        request = record.request
        if record.status != "cancelled":
            record.status = outcome
        record.incomplete_reason = reason
        record.completed_at = int(time.time()) if outcome == "completed" else None
        record.usage = self._usage
        if self._engine_end:
            record.stats.api_post_ms = (time.perf_counter() - self._engine_end) * 1000
        snapshot = record.snapshot()
        state = self.state
        if (
            state is not None
            and self.lane.cache is not None
            and record.status in ("completed", "incomplete")
        ):
            state.last_response = snapshot
            if not request.store:
                state.stored_chain = False
            evicted = self.lane.cache.put(self.id, state)
            if evicted:
                core.metrics.cache_evictions.inc(evicted)
        stored = self._stored(snapshot)
        ledger = self._ledger_row()
        if self.lane.inflight is self:
            self.lane.inflight = None
        core.limiter.charge_tokens(
            self.quota_key, self._usage.input_tokens + self._usage.output_tokens
        )
        if stored is not None and state is not None and core.draining:
            await self._hand_off(state)
        job = PostJob(stored, ledger)
        if core.ack_after_write or (stored is not None and core.config.workers > 1):
            # A shared store (or worker processes sharing the SQLite file, which read stored
            # responses from disk only): the terminal event goes out only once any process can
            # read the response (the write goes on if this task is cancelled).
            self._posted = True
            await core.post.write_through(job)
        else:
            try:
                # Durable (journal) before the terminal event; the store write comes later.
                await core.post.put(job)
            except StorageUnavailable as exc:
                # What cannot be made durable is never reported done: the response fails.
                if self.lane.cache is not None:
                    self.lane.cache.take(self.id)
                outcome = record.status = "failed"
                record.completed_at = None
                record.error = {
                    "code": "storage_unavailable",
                    "message": f"The response could not be stored ({exc}); it was not kept.",
                }
                snapshot = record.snapshot()
                await core.post.put(PostJob(None, self._ledger_row()))
            self._posted = True  # from here on, a cut-short stream must not queue a second row
        core.counters.record(record.stats)
        self._observe(record.status)
        terminal = {
            "completed": "response.completed",
            "incomplete": "response.incomplete",
            "failed": "response.failed",
        }[outcome]
        await self.emit(self.seq.event(terminal, response=snapshot))

    def _stored(self, snapshot: dict[str, Any]) -> StoredResponse | None:
        """What ``store: true`` keeps: completed, incomplete and cancelled responses alike
        (a cancelled one with the output it had), as the hosted API stores them; a background
        response however it ended."""
        assert self.record is not None
        request = self.record.request
        if not request.store or self.state is None:
            return None
        # A failed response is stored only in background mode: its client polls for it.
        if self.record.status == "failed" and not request.background:
            return None
        self_contained = request.previous_response_id is None or not self.state.stored_chain
        return StoredResponse(
            response=snapshot,
            input_items=self._stored_input(self_contained),
            previous_response_id=request.previous_response_id,
            self_contained=self_contained,
            tenant=self.tenant,
        )

    def _observe(self, status: str) -> None:
        """Metrics of a response that reached a terminal state."""
        assert self.record is not None
        metrics = self.core.metrics
        stats = self.record.stats
        metrics.responses.labels(self.transport, self.model_label, status).inc()
        metrics.tokens_rendered.inc(stats.tokens_rendered)
        metrics.tokens_reused.inc(stats.tokens_reused)
        metrics.turn_latency.labels(self.transport, self.model_label).observe(
            time.perf_counter() - self.received
        )

    def first_delta(self) -> None:
        """Record time to first token, once per response."""
        if not self._ttft_seen:
            self._ttft_seen = True
            self.core.metrics.ttft.labels(self.transport, self.model_label).observe(
                time.perf_counter() - self.received
            )

    def _ledger_row(self) -> LedgerRow:
        assert self.record is not None
        record = self.record
        request = record.request
        return LedgerRow(
            response_id=self.id,
            # The authenticated tenant; on an open server the token's label or the body's user.
            tenant=self.tenant or request.user or "anonymous",
            model=request.model,
            status=record.status,
            input_tokens=self._usage.input_tokens,
            cached_tokens=self._usage.cached_tokens,
            output_tokens=self._usage.output_tokens,
            engine_ms=record.stats.engine_ms,
            api_pre_ms=record.stats.api_pre_ms,
            api_post_ms=record.stats.api_post_ms,
            transport=self.transport,
            created_at=record.created_at,
            completed_at=record.completed_at,
        )

    def _abandon(self) -> None:
        """Queue the ledger row of a started response that the stream's end cut short."""
        if self.record is None or not self._started or self._posted:
            return
        self._posted = True
        self.record.status = "cancelled"
        self.record.incomplete_reason = "stream_closed"
        self.record.usage = self._usage
        self.core.counters.record(self.record.stats)
        self._observe("cancelled")
        # No client waits for it, and the stream's task is being cancelled: the queue makes
        # it durable on its own (and its drain waits for it). A ``store: true`` response is
        # stored with the output it had.
        self.core.post.submit(PostJob(self._stored(self.record.snapshot()), self._ledger_row()))

    def _stored_input(self, self_contained: bool) -> list[Item]:
        """The input items a stored response keeps (see ``Store``)."""
        assert self.record is not None and self.state is not None
        if not self_contained:
            return list(self._inputs)
        output_ids = {id(item) for item in self.record.output}
        return [item for item in self.state.items if id(item) not in output_ids]
