"""The core facade: the application starts, drains and closes it, and hands it to each
transport as the two ports it offers (``transport_ports``).

``ResponsesCore`` creates streams (``open_session``) and one-shot responses (``respond``),
serves stored responses (retrieve, delete, input items, cancel), compaction, token counts,
models and background responses, reports stats and drains.
Its parts (``CoreParts``) are built by the composition root beside the core
(``server/assembly.py``) and passed to what uses them: a stream and each of its runs get them
as one typed bundle (``runs.deps.RunDeps``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass

from bidi_responses.schema import (
    CompactionResponse,
    DeletedResponse,
    InputItemList,
    InputTokensCount,
    JSONObject,
    JSONValue,
    ModelList,
    ModelObject,
    ResponseObject,
    ServerEvent,
)

from ..config import ServerConfig
from .api.errors import ApiError, not_found, shown
from .lanes.naming import StreamNaming
from .lanes.session import Session
from .observability.counters import ServerStats
from .one_shot import OneShotOps
from .process.activity import Activity
from .process.malloc_trim import IdleTrimmer
from .process.uncancelled import uncancelled
from .runs.background import BackgroundRuns
from .runs.deps import InflightRun, RunDeps
from .runs.one_shot import OneShotRuns
from .tenancy.auth import ApiKeys
from .tenancy.caller import ANONYMOUS, Caller
from .tenancy.request_budget import RequestBytes
from .transport_ports import StreamSession


@dataclass(frozen=True, slots=True)
class CoreParts:
    """The core's parts, built by the composition root (``server/assembly.py``)."""

    # What runs and streams use.
    runs: RunDeps
    # The credentials the transports check.
    keys: ApiKeys
    # Returns freed memory to the OS once the server is idle.
    trimmer: IdleTrimmer
    # What is open (streams, one-shot creates): when the server is idle.
    activity: Activity
    # Creates without a stream (stateless HTTP, CreateResponse), and background responses.
    one_shots: OneShotRuns
    background: BackgroundRuns
    # Compact, input token counts, models.
    one_shot: OneShotOps
    # Request bytes read or held at once, over every transport.
    request_bytes: RequestBytes
    started_at: int


class ResponsesCore:
    """Streams and responses, stored responses, stats and drain, over the composed parts."""

    def __init__(self, config: ServerConfig, parts: CoreParts) -> None:
        self.parts = parts
        deps = self.deps = self.parts.runs
        self.config = config
        self.log = deps.log
        # What the transports read: credentials, instruments, limits, the one-shot operations.
        self.keys = self.parts.keys
        self.metrics = deps.metrics
        self.counters = deps.counters
        self.limiter = deps.limiter
        self.one_shot = self.parts.one_shot
        self.background = self.parts.background
        self.request_bytes = self.parts.request_bytes
        # Called once when a drain begins (the health service turns NOT_SERVING).
        self.drain_hooks: list[Callable[[], None]] = []
        self.sessions_open = 0
        self._sessions: set[Session] = set()
        # One-shot creates in progress (``respond``): a drain waits for them, or stops them.
        self._one_shots = self.parts.one_shots
        self._activity = self.parts.activity

    @property
    def draining(self) -> bool:
        """True once a drain began: new responses are refused (``server_shutting_down``)."""
        return self.deps.state.draining

    async def start(self) -> None:
        """Connect the store, replay the journal, then start background work (the
        post-inference writer)."""
        await self.deps.store.open()
        await self.deps.post.start()
        self.metrics.gc_timer.start()

    def begin_drain(self) -> None:
        """From now on refuse new responses (``server_shutting_down``) and report NOT_SERVING
        to health checks."""
        if self.draining:
            return
        self.deps.state.draining = True
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
            session.warn_draining(self.config.grace_period_s)
        waits = [session.finish() for session in sessions]
        await asyncio.gather(*waits, self._one_shots.wait_all(), return_exceptions=True)

    async def cut_streams(self) -> None:
        """Graceful stop, once the grace period is over: stop the responses still running
        (each keeps its ledger row) and end every stream, so that each transport ends its
        streams with their own status (``server_shutting_down``) rather than the listener
        cancelling them."""
        stops = [session.finish(wait_for_runs=False) for session in list(self._sessions)]
        await asyncio.gather(*stops, self._one_shots.stop_all(), return_exceptions=True)

    async def close(self) -> None:
        """Stop streams, then drain post-inference work so nothing completed is lost."""
        try:
            self.begin_drain()
            await self.background.close()
            for session in list(self._sessions):
                await session.close()
            await self._one_shots.stop_all()
            deps = self.deps
            await deps.post.drain(self.config.durability.drain_timeout_s)
            await deps.router.aclose()
            await deps.store.aclose()
            await deps.pipeline.close()
        finally:
            self.metrics.gc_timer.stop()

    # -- streams -----------------------------------------------------------------------------

    def open_session(self, naming: StreamNaming, *, caller: Caller = ANONYMOUS) -> Session:
        """A new stream session of ``caller``, named as its transport names it; the transport
        must ``close_session`` it in a finally block. ApiError 429 if that caller has too many
        streams open."""
        self.limiter.open_stream(caller.quota_key)
        session = Session(self.deps, naming, caller=caller)
        self._sessions.add(session)
        self._activity.begin()
        self.sessions_open += 1
        self.metrics.open_streams.labels(naming.transport).inc()
        return session

    async def close_session(self, session: StreamSession) -> None:
        """Release a stream: stop its in-flight work and drop its cache."""
        # Only sessions opened here come back here.
        assert isinstance(session, Session)
        # The handler calling this may be cancelled meanwhile (its client went away right
        # after an error): the session is released whole all the same.
        if session in self._sessions:
            self._sessions.discard(session)
            self.sessions_open -= 1
            self.limiter.close_stream(session.quota_key)
            self.metrics.open_streams.labels(session.transport).dec()
            await uncancelled(self._release(session))
        else:
            await uncancelled(session.close())

    async def _release(self, session: Session) -> None:
        try:
            await session.close()
        finally:
            await self._activity.end()

    async def wait_until_idle(self) -> None:
        """Wait until no stream is open and no response is in flight."""
        await self._activity.wait_until_idle()

    # -- one-shot responses ------------------------------------------------------------------

    def respond_batches(
        self, body: JSONObject, transport: str, caller: Caller = ANONYMOUS, max_events: int = 1
    ) -> AsyncGenerator[list[ServerEvent], None]:
        """One create without a stream (stateless HTTP, gRPC ``CreateResponse``): its events
        up to and including the terminal (or error) one, as lists of the events ready together
        (at most ``max_events`` each). Closing it early stops the response."""
        return self._one_shots.respond_batches(body, transport, caller, max_events)

    def respond(
        self, body: JSONObject, transport: str, caller: Caller = ANONYMOUS
    ) -> AsyncGenerator[ServerEvent, None]:
        """``respond_batches`` one event at a time."""
        return self._one_shots.respond(body, transport, caller)

    async def start_background(
        self, body: JSONObject, transport: str, caller: Caller = ANONYMOUS
    ) -> ServerEvent:
        """Start a background response; its first event (``response.created`` or ``error``)."""
        return await self.background.start(body, transport, caller)

    def background_events(
        self, response_id: str, starting_after: int, tenant: str | None = None
    ) -> AsyncIterator[ServerEvent]:
        """A background response's kept events after ``starting_after`` (-1: all), live to
        the end (ApiError if they are not kept)."""
        return self.background.events(response_id, starting_after, tenant)

    def is_background(self, response_id: str, tenant: str | None = None) -> bool:
        """Whether ``response_id`` is a background response of ``tenant`` whose events are
        still kept."""
        return self.background.is_background(response_id, tenant)

    async def compact(
        self, raw: JSONValue, transport: str, caller: Caller = ANONYMOUS
    ) -> CompactionResponse:
        """Compact a conversation (``POST /v1/responses/compact``)."""
        return await self.one_shot.compact(raw, transport, caller)

    async def count_input_tokens(
        self, raw: JSONValue, tenant: str | None = None
    ) -> InputTokensCount:
        """The prompt tokens a create with this body would use."""
        return await self.one_shot.count_input_tokens(raw, tenant)

    def list_models(self) -> ModelList:
        """The models served."""
        return self.one_shot.list_models()

    def get_model(self, model_id: str) -> ModelObject:
        """One model served (ApiError 404 if none)."""
        return self.one_shot.get_model(model_id)

    def rate_limit_headers(self, quota_key: str) -> dict[str, str]:
        """OpenAI's ``x-ratelimit-*`` headers for the caller behind ``quota_key``."""
        return self.limiter.headers(quota_key)

    # -- stored responses --------------------------------------------------------------------

    # Every lookup takes the caller's tenant: another tenant's id is "not found", exactly like
    # an id that never existed, so ids leak nothing across tenants.

    def _inflight(self, response_id: str, tenant: str | None) -> InflightRun | None:
        run = self.deps.state.inflight.get(response_id)
        return run if run is not None and run.tenant == tenant else None

    async def get_response(self, response_id: str, tenant: str | None = None) -> ResponseObject:
        """A stored response object (ApiError 404 if none)."""
        record = await self.deps.store.get(response_id, tenant)
        if record is None:
            run = self._inflight(response_id, tenant)
            if run is not None and run.record is not None:
                return run.record.snapshot()
            raise not_found("response", response_id)
        return record.response

    async def delete_response(self, response_id: str, tenant: str | None = None) -> DeletedResponse:
        """Delete a stored response (ApiError 404 if none)."""
        if not await self.deps.store.delete(response_id, tenant):
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
        record = await self.deps.store.get(response_id, tenant)
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
                stored = await self.deps.store.get(response_id, tenant)
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

    def stats(self) -> ServerStats:
        """Cumulative counters of this process (GetStats / GET /v1/stats), and which it is."""
        deps = self.deps
        return {
            **self.counters.snapshot(),
            "worker_index": self.config.worker_index,
            "workers": self.config.workers,
            "worker_pid": os.getpid(),
            "streams_open": self.sessions_open,
            "route_resolutions_total": deps.router.resolutions,
            "post_queue_depth": deps.post.depth,
            "post_queue": deps.post.counters(),
            "cache": {
                **deps.cache_budget.counters(),
                "prompt_rerenders": deps.state.prompt_rerenders,
            },
            "failover": dict(deps.state.failover),
        }
