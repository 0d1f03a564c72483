"""What a run and a stream get from the core: one typed bundle, built by the composition root
(``server/assembly.py``), instead of the whole core.

``RunDeps`` holds the long-lived parts (store, post-inference queue, limits, metrics, router,
renderer, pipeline, compaction codec, the shared state tier); ``ServerState`` is the little
that changes while the server runs (draining, the in-flight responses, failover counts).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Protocol

from ...config import ServerConfig
from ..api.errors import ApiError
from ..conversation.recent import RecentStates
from ..conversation.state import MemoryBudget
from ..observability.counters import Counters
from ..observability.metrics import Metrics
from ..ports import Pipeline
from ..rendering.render import Renderer
from ..storage.backend import ResponseStore
from ..storage.handoff import StateTier
from ..storage.postinference import PostQueue
from ..tenancy.limits import TenantLimiter
from .compaction import CompactionCodec
from .record import ResponseRecord
from .routing import Router


class InflightRun(Protocol):
    """What the server asks of a response in flight, from any stream (retrieve, cancel,
    idempotency): a ``runner.ResponseRun``."""

    @property
    def tenant(self) -> str | None:
        """Who owns the response."""

    @property
    def record(self) -> ResponseRecord | None:
        """The response as it evolves (None until its request was accepted)."""

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task running it."""

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop it promptly; it ends as incomplete with ``reason``."""


def _failover() -> dict[str, int]:
    return {"idempotent_replays": 0, "states_handed_off": 0, "states_restored": 0}


@dataclass(slots=True)
class ServerState:
    """What changes while the server runs, shared by the facade and every run."""

    # Set when a drain begins: new responses are refused from then on.
    draining: bool = False
    # Responses that passed admission and have not ended, by id (cancel, retrieve, idempotency).
    inflight: dict[str, InflightRun] = field(default_factory=dict)
    # Replica failover counters (GetStats ``failover``).
    failover: dict[str, int] = field(default_factory=_failover)
    # Turns whose chat template no longer kept the cached prompt as a prefix.
    prompt_rerenders: int = 0
    # The states of recent stored responses made without a stream (``RunDeps.recent``).
    recent: RecentStates | None = None

    def admit(self) -> None:
        """ApiError 503 once a drain began: a new response is refused."""
        if self.draining:
            raise ApiError(
                "The server is shutting down and takes no new responses; "
                "retry on a new connection.",
                code="server_shutting_down",
                status=503,
                type="server_error",
            )


@dataclass(frozen=True, slots=True)
class RunDeps:
    """Everything a run (and the stream that starts it) uses."""

    config: ServerConfig
    log: logging.Logger
    store: ResponseStore
    post: PostQueue
    # A turn is acknowledged only once its write landed (a store shared by replicas).
    ack_after_write: bool
    # Where draining streams leave their cached states for other replicas (handoff.py).
    state_tier: StateTier | None
    limiter: TenantLimiter
    metrics: Metrics
    counters: Counters
    router: Router
    renderer: Renderer
    pipeline: Pipeline
    compaction: CompactionCodec
    # The byte bound all stream caches share.
    cache_budget: MemoryBudget
    state: ServerState

    @property
    def recent(self) -> RecentStates:
        """The process's recent stored responses' states (``conversation/recent.py``), made on first
        use, within the budget all stream caches share."""
        recent = self.state.recent
        if recent is None:
            cache = self.config.cache
            recent = RecentStates(cache.recent_max_responses, cache.max_bytes, self.cache_budget)
            self.state.recent = recent
        return recent

    def note_prompt_rerender(self, format_name: str) -> None:
        """A chat template rendered earlier turns differently: the cached prompt tokens were
        not a prefix of the new render (``continuation.render_whole``)."""
        self.state.prompt_rerenders += 1
        self.metrics.prompt_rerenders.labels(format_name).inc()
