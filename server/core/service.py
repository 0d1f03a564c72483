"""The core facade that every transport talks to.

``ResponsesCore`` owns the shared, long-lived parts: tokenizer and renderer, router and
engines, the pre-inference pipeline, the durable store, the post-inference queue and the
counters. Per-stream state lives in ``Session`` objects that it hands out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import AsyncGenerator, Callable

import tiktoken
from bidi_responses.server.config import RouteConfig, ServerConfig
from bidi_responses.server.core.api.errors import ApiError, not_found, shown
from bidi_responses.server.core.api.items import JSONValue
from bidi_responses.server.core.api.schema import (
    DeletedResponse,
    InputItemList,
    ResponseObject,
    ServerEvent,
)
from bidi_responses.server.core.compaction import CompactionCodec, load_key
from bidi_responses.server.core.lanes.session import Session
from bidi_responses.server.core.lanes.state import MemoryBudget
from bidi_responses.server.core.malloc_trim import IdleTrimmer
from bidi_responses.server.core.observability.counters import Counters, ServerStats
from bidi_responses.server.core.observability.metrics import Metrics
from bidi_responses.server.core.one_shot import SurfaceOps
from bidi_responses.server.core.rendering.render import Renderer
from bidi_responses.server.core.rendering.tokenizer import load_encoding
from bidi_responses.server.core.routing import Router
from bidi_responses.server.core.runs.background import BackgroundRuns
from bidi_responses.server.core.runs.record import TERMINAL_TYPES
from bidi_responses.server.core.runs.runner import ResponseRun
from bidi_responses.server.core.storage.backend import ResponseStore, open_store
from bidi_responses.server.core.storage.handoff import StateTier
from bidi_responses.server.core.storage.journal import Journal
from bidi_responses.server.core.storage.postinference import PostQueue
from bidi_responses.server.core.tenancy.auth import ApiKeys
from bidi_responses.server.core.tenancy.limits import TenantLimiter
from bidi_responses.server.core.tenancy.request_budget import RequestBytes
from bidi_responses.server.engines import build_engine
from bidi_responses.server.engines.base import Engine
from bidi_responses.server.pipeline import build_pipeline


class ResponsesCore(SurfaceOps):
    """Shared server state and the operations that are not per-stream."""

    def __init__(self, config: ServerConfig, *, encoding: tiktoken.Encoding | None = None) -> None:
        self.config = config
        self.log = logging.getLogger("bidi_responses")
        self.encoding = encoding if encoding is not None else load_encoding()
        self.compaction = CompactionCodec(
            load_key(config.compaction_key_path),
            summary_item_chars=config.compaction.summary_item_chars,
        )
        self.renderer = Renderer(self.encoding, self.compaction.summary)
        self.router = Router(config.models, self._build_engine)
        self.pipeline = build_pipeline(config.stages, config.stage_settings)
        self.pipeline.offload_chars = config.limits.offload_chars
        # Request bytes read or held at once, over every transport
        # (server/core/tenancy/request_budget.py).
        self.request_bytes = RequestBytes(config.limits.max_inflight_request_bytes)
        self.store: ResponseStore = open_store(
            config.store.url,
            config.store_path,
            pool_size=config.store.pool_size,
            connect_timeout_s=config.store.connect_timeout_s,
        )
        ack = config.store.ack_after_write
        # With a shared store a turn is acknowledged only once any replica can read it.
        self.ack_after_write = self.store.shared if ack is None else ack
        # Where draining streams leave their cached states for other replicas (handoff.py).
        self.state_tier: StateTier | None = (
            self.store if config.store.state_handoff and isinstance(self.store, StateTier) else None
        )
        durability = config.durability
        # Acknowledged before the store write lands: the job is made durable in this
        # process's journal first. (A turn acknowledged only after its write needs none.)
        journal = (
            Journal(
                config.journal_dir,
                segment_bytes=durability.segment_bytes,
                sync=durability.fsync,
            )
            if durability.journal and not self.ack_after_write
            else None
        )
        self.post = PostQueue(
            self.store,
            config.post_queue_size,
            journal=journal,
            max_retry_delay_s=durability.max_retry_delay_s,
            probe_interval_s=durability.probe_interval_s,
        )
        self.cache_budget = MemoryBudget(config.cache.global_max_bytes)
        # Set by ``begin_drain`` on shutdown: new responses are refused from then on.
        self.draining = False
        # Called once when a drain begins (the health service turns NOT_SERVING).
        self.drain_hooks: list[Callable[[], None]] = []
        # Replica failover counters (GetStats ``failover``).
        self.failover = {"idempotent_replays": 0, "states_handed_off": 0, "states_restored": 0}
        self.counters = Counters()
        # Turns whose chat template no longer kept the cached prompt as a prefix (GetStats
        # ``cache.prompt_rerenders``).
        self.prompt_rerenders = 0
        auth = config.auth
        self.keys = ApiKeys.load(auth.api_keys, auth.api_keys_file, auth.api_keys_env)
        self.metrics = Metrics(lambda model: self.router.engine_name(model) is not None)
        self.limiter = TenantLimiter(
            config.tenant_limits, on_reject=lambda limit: self.metrics.limited.labels(limit).inc()
        )
        self.metrics.post_queue_depth.set_function(lambda: self.post.depth)
        self.inflight: dict[str, ResponseRun] = {}
        self.sessions_open = 0
        self._sessions: set[Session] = set()
        self._idle = asyncio.Condition()
        self.trimmer = IdleTrimmer(config.trim_memory_idle_s, config.trim_memory_idle_s > 0)
        self.background = BackgroundRuns(self, config.background)
        self.started_at = int(time.time())

    def _build_engine(self, route: RouteConfig) -> Engine:
        # A copy, checked again (settings files and flags fill the config in field by field),
        # so a later change of the route's settings cannot reach a running engine.
        return build_engine(
            route.engine,
            sim_config=dataclasses.replace(route.sim),
            script_path=route.script_path,
            encoding=self.encoding,
            completions=dataclasses.replace(route.completions),
            upstream=dataclasses.replace(route.upstream),
            open_compaction=self.compaction.summary,
        )

    async def start(self) -> None:
        """Connect the store, replay the journal, then start background work (the
        post-inference writer)."""
        await self.store.open()
        await self.post.start()

    def begin_drain(self) -> None:
        """From now on refuse new responses (``server_shutting_down``) and report NOT_SERVING
        to health checks."""
        if self.draining:
            return
        self.draining = True
        for hook in self.drain_hooks:
            try:
                hook()
            except Exception:
                self.log.exception("drain hook failed")

    async def drain_streams(self) -> None:
        """Graceful stop, first half: refuse new responses (``server_shutting_down``), tell
        every stream (a ``server_draining`` warning), let in-flight responses finish and
        deliver their terminal events, then end every stream."""
        self.begin_drain()
        sessions = list(self._sessions)
        # States first, then the warning: a client that moves at once finds its state.
        await asyncio.gather(*(s.hand_off_idle() for s in sessions), return_exceptions=True)
        for session in sessions:
            if session.stateful:
                session.warn_draining(self.config.grace_period_s)
        if sessions:
            await asyncio.gather(
                *(session.finish() for session in sessions), return_exceptions=True
            )

    async def cut_streams(self) -> None:
        """Graceful stop, once the grace period is over: stop the responses still running
        (each keeps its ledger row) and end every stream, so that each transport ends its
        streams with their own status (``server_shutting_down``) rather than the listener
        cancelling them."""
        sessions = list(self._sessions)
        await asyncio.gather(
            *(session.finish(wait_for_runs=False) for session in sessions), return_exceptions=True
        )

    async def close(self) -> None:
        """Stop streams, then drain post-inference work so nothing completed is lost."""
        self.begin_drain()
        await self.background.close()
        for session in list(self._sessions):
            await session.close()
        await self.post.drain(self.config.durability.drain_timeout_s)
        await self.router.aclose()
        await self.store.aclose()
        await self.pipeline.close()

    # -- streams -----------------------------------------------------------------------------

    def open_session(
        self,
        transport: str,
        *,
        stateful: bool = True,
        tenant: str | None = None,
        quota_key: str | None = None,
    ) -> Session:
        """A new stream session for ``tenant`` (None on an open server); the transport must
        ``close_session`` it in a finally block.

        ``quota_key`` is whom limits count against (the tenant, or on an open server the
        token's label); ApiError 429 if that caller has too many streams open.
        """
        quota = quota_key or tenant or "anonymous"
        if stateful:
            self.limiter.open_stream(quota)
        session = Session(self, transport, stateful=stateful, tenant=tenant, quota_key=quota)
        self._sessions.add(session)
        self.trimmer.busy()
        if stateful:
            self.sessions_open += 1
            self.metrics.open_streams.labels(transport).inc()
        return session

    async def close_session(self, session: Session) -> None:
        """Release a stream: stop its in-flight work and drop its cache."""
        if session in self._sessions:
            self._sessions.discard(session)
            if session.stateful:
                self.sessions_open -= 1
                self.limiter.close_stream(session.quota_key)
                self.metrics.open_streams.labels(session.transport).dec()
        await session.close()
        if not self._sessions:
            self.trimmer.idle(lambda: not self._sessions and not self.inflight)
        async with self._idle:
            self._idle.notify_all()

    async def wait_until_idle(self) -> None:
        """Wait until no stream is open and no response is in flight."""
        async with self._idle:
            await self._idle.wait_for(lambda: not self._sessions and not self.inflight)

    async def stateless(
        self,
        body: JSONValue,
        transport: str,
        tenant: str | None = None,
        quota_key: str | None = None,
    ) -> AsyncGenerator[ServerEvent, None]:
        """One stateless create: its events up to and including the terminal (or error) one."""
        session = self.open_session(transport, stateful=False, tenant=tenant, quota_key=quota_key)
        try:
            await session.handle(_create_event(body))
            async for out in session.events():
                yield out.data
                kind = out.data["type"]
                if kind in TERMINAL_TYPES or kind == "error":
                    return
        finally:
            await self.close_session(session)

    async def stateless_batches(
        self,
        body: JSONValue,
        transport: str,
        max_events: int,
        tenant: str | None = None,
        quota_key: str | None = None,
    ) -> AsyncGenerator[list[ServerEvent], None]:
        """``stateless`` as lists of the events ready together (``Session.event_batches``)."""
        session = self.open_session(transport, stateful=False, tenant=tenant, quota_key=quota_key)
        try:
            await session.handle(_create_event(body))
            async for batch in session.event_batches(max_events):
                out: list[ServerEvent] = []
                for event in batch:
                    out.append(event.data)
                    kind = event.data["type"]
                    if kind in TERMINAL_TYPES or kind == "error":
                        yield out
                        return
                yield out
        finally:
            await self.close_session(session)

    # -- stored responses --------------------------------------------------------------------

    # Every lookup takes the caller's tenant: another tenant's id is "not found", exactly like
    # an id that never existed, so ids leak nothing across tenants.

    def _inflight(self, response_id: str, tenant: str | None) -> ResponseRun | None:
        run = self.inflight.get(response_id)
        return run if run is not None and run.tenant == tenant else None

    async def get_response(self, response_id: str, tenant: str | None = None) -> ResponseObject:
        """A stored response object (ApiError 404 if none)."""
        record = await self.store.get(response_id, tenant)
        if record is None:
            run = self._inflight(response_id, tenant)
            if run is not None and run.record is not None:
                return run.record.snapshot()
            raise not_found("response", response_id)
        return record.response

    async def delete_response(self, response_id: str, tenant: str | None = None) -> DeletedResponse:
        """Delete a stored response (ApiError 404 if none)."""
        if not await self.store.delete(response_id, tenant):
            raise not_found("response", response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    async def list_input_items(
        self,
        response_id: str,
        *,
        limit: int = 20,
        order: str = "desc",
        after: str | None = None,
        tenant: str | None = None,
    ) -> InputItemList:
        """One page of a stored response's input items, OpenAI list shape."""
        if not 1 <= limit <= 100:
            raise ApiError("Invalid 'limit': expected 1 to 100.", param="limit")
        if order not in ("asc", "desc"):
            raise ApiError("Invalid 'order': expected 'asc' or 'desc'.", param="order")
        record = await self.store.get(response_id, tenant)
        if record is None:
            raise not_found("response", response_id)
        items = list(record.input_items)
        if order == "desc":
            items.reverse()
        start = 0
        if after is not None:
            ids = [item.get("id") for item in items]
            if after not in ids:
                raise ApiError(
                    f"Invalid 'after': no item '{shown(after)}' in this list.", param="after"
                )
            start = ids.index(after) + 1
        page = items[start : start + limit]
        listing: InputItemList = {
            "object": "list",
            "data": page,
            "first_id": page[0].get("id") if page else None,
            "last_id": page[-1].get("id") if page else None,
            "has_more": start + limit < len(items),
        }
        return listing

    async def cancel_response(self, response_id: str, tenant: str | None = None) -> ResponseObject:
        """Cancel an in-flight response from any connection; returns it as it ended.

        A finished response can be "cancelled" again only if it ran in the background (the
        answer is then the response as it ended, as the hosted API gives it); any other
        finished response is a 400, as in the hosted API, where only background responses
        can be cancelled.
        """
        run = self._inflight(response_id, tenant)
        record = run.record if run is not None else None
        if (
            run is None
            or run.task is None
            or record is None
            or record.status not in ("queued", "in_progress")
        ):
            # Ended, or ending: a run that has begun its end keeps its outcome.
            if record is not None:
                response = record.snapshot()
            else:
                stored = await self.store.get(response_id, tenant)
                if stored is None:
                    raise not_found("response", response_id)
                response = stored.response
            if not response.get("background"):
                raise ApiError(
                    "Only background responses can be cancelled once they have ended; "
                    f"response '{shown(response_id)}' has finished "
                    f"(status '{response.get('status')}').",
                    code="response_not_cancellable",
                    param="response_id",
                )
            return response
        run.cancel()
        # Wait without re-raising: the run reports its own outcome, and a cancellation of
        # this caller must still propagate.
        await asyncio.wait([run.task])
        return record.snapshot()

    def note_prompt_rerender(self, format_name: str) -> None:
        """A chat template rendered earlier turns differently: the cached prompt tokens were
        not a prefix of the new render (``continuation.render_whole``)."""
        self.prompt_rerenders += 1
        self.metrics.prompt_rerenders.labels(format_name).inc()

    def stats(self) -> ServerStats:
        """Cumulative counters of this process (GetStats / GET /v1/stats), and which it is."""
        return {
            **self.counters.snapshot(),
            "worker_index": self.config.worker_index,
            "workers": self.config.workers,
            "worker_pid": os.getpid(),
            "streams_open": self.sessions_open,
            "route_resolutions_total": self.router.resolutions,
            "post_queue_depth": self.post.depth,
            "post_queue": self.post.counters(),
            "cache": {**self.cache_budget.counters(), "prompt_rerenders": self.prompt_rerenders},
            "failover": dict(self.failover),
        }


def _create_event(body: JSONValue) -> JSONValue:
    """A stateless request body as the session's ``response.create`` event."""
    event = dict(body) if isinstance(body, dict) else body
    if isinstance(event, dict):
        event.pop("stream_id", None)
        event["type"] = "response.create"
    return event
