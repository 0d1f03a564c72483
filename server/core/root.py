"""The composition root: every long-lived part of the core is built here, once, and handed to
what uses it.

``compose`` reads the configuration and returns the parts: the store and its post-inference
queue (with its journal), limits, metrics and counters, the router and its engines, the
renderer, the pre-inference pipeline, the compaction codec, the state hand-off tier, and the
one-shot creates and background responses over them. Runs and streams get them as one typed
bundle (``runs.deps.RunDeps``); the facade (``service.ResponsesCore``) keeps only what it
serves. Tests pass fakes in here (an engine factory) rather than overriding the core.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import tiktoken

from ..config import RouteConfig, ServerConfig
from ..engines import build_engine
from ..engines.base import Engine
from ..pipeline import build_pipeline
from .activity import Activity
from .compaction import CompactionCodec, load_key
from .lanes.state import MemoryBudget
from .malloc_trim import IdleTrimmer
from .observability.counters import Counters
from .observability.metrics import Metrics
from .one_shot import OneShotOps
from .rendering.render import Renderer
from .rendering.tokenizer import load_encoding
from .routing import Router
from .runs.background import BackgroundRuns
from .runs.deps import RunDeps, ServerState
from .runs.one_shot import OneShotRuns
from .storage.backend import open_store
from .storage.handoff import StateTier
from .storage.journal import Journal
from .storage.postinference import PostQueue
from .tenancy.auth import ApiKeys
from .tenancy.limits import TenantLimiter
from .tenancy.request_budget import RequestBytes

#: Builds the engine of one model route (the router calls it once per route).
EngineFactory = Callable[[RouteConfig], Engine]


@dataclass(frozen=True, slots=True)
class CoreParts:
    """The core's parts, built by ``compose``."""

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


def compose(
    config: ServerConfig,
    *,
    encoding: tiktoken.Encoding | None = None,
    engine_factory: EngineFactory | None = None,
) -> CoreParts:
    """Build the core's parts from ``config``. ``engine_factory`` replaces the engines the
    routes name (tests pass a scripted one); ``encoding`` a loaded tokenizer."""
    log = logging.getLogger("bidi_responses")
    encoding = encoding if encoding is not None else load_encoding()
    compaction = CompactionCodec(
        load_key(config.compaction_key_path),
        summary_item_chars=config.compaction.summary_item_chars,
    )

    def configured_engine(route: RouteConfig) -> Engine:
        # A copy, checked again (settings files and flags fill the config in field by field),
        # so a later change of the route's settings cannot reach a running engine.
        return build_engine(
            route.engine,
            sim_config=dataclasses.replace(route.sim),
            script_path=route.script_path,
            encoding=encoding,
            completions=dataclasses.replace(route.completions),
            upstream=dataclasses.replace(route.upstream),
            open_compaction=compaction.summary,
        )

    router = Router(config.models, engine_factory or configured_engine)
    pipeline = build_pipeline(config.stages, config.stage_settings)
    # Above this many characters a create's pre-inference work leaves the event loop.
    pipeline.offload_chars = config.limits.offload_chars
    store = open_store(
        config.store.url,
        config.store_path,
        pool_size=config.store.pool_size,
        connect_timeout_s=config.store.connect_timeout_s,
    )
    ack = config.store.ack_after_write
    # With a shared store a turn is acknowledged only once any replica can read it.
    ack_after_write = store.shared if ack is None else ack
    durability = config.durability
    # Acknowledged before the store write lands: the job is made durable in this process's
    # journal first. (A turn acknowledged only after its write needs none.)
    journal = (
        Journal(config.journal_dir, segment_bytes=durability.segment_bytes, sync=durability.fsync)
        if durability.journal and not ack_after_write
        else None
    )
    post = PostQueue(
        store,
        config.post_queue_size,
        journal=journal,
        max_retry_delay_s=durability.max_retry_delay_s,
        probe_interval_s=durability.probe_interval_s,
    )
    metrics = Metrics(lambda model: router.engine_name(model) is not None)
    metrics.post_queue_depth.set_function(lambda: post.depth)
    limiter = TenantLimiter(
        config.tenant_limits, on_reject=lambda limit: metrics.limited.labels(limit).inc()
    )
    auth = config.auth
    runs = RunDeps(
        config=config,
        log=log,
        store=store,
        post=post,
        ack_after_write=ack_after_write,
        state_tier=store if config.store.state_handoff and isinstance(store, StateTier) else None,
        limiter=limiter,
        metrics=metrics,
        counters=Counters(),
        router=router,
        renderer=Renderer(encoding, compaction.summary),
        pipeline=pipeline,
        compaction=compaction,
        cache_budget=MemoryBudget(config.cache.global_max_bytes),
        state=ServerState(),
    )
    started_at = int(time.time())
    trimmer = IdleTrimmer(config.trim_memory_idle_s, config.trim_memory_idle_s > 0)
    activity = Activity(trimmer, runs.state)
    one_shots = OneShotRuns(runs, activity)
    return CoreParts(
        runs=runs,
        keys=ApiKeys.load(auth.api_keys, auth.api_keys_file, auth.api_keys_env),
        trimmer=trimmer,
        activity=activity,
        one_shots=one_shots,
        background=BackgroundRuns(one_shots.respond, config.background),
        one_shot=OneShotOps(runs, started_at),
        request_bytes=RequestBytes(config.limits.max_inflight_request_bytes),
        started_at=started_at,
    )
