"""The composition root: every long-lived part of the server is built here, once, and handed
to what uses it. It sits beside the core, not in it: the engines and the pre-inference pipeline
are plugged in here, so the core never imports them.

``compose`` reads the configuration and returns the parts: the store and its post-inference
queue (with its journal), limits, metrics and counters, the router and its engines, the
renderer, the pre-inference pipeline, the compaction codec, the state hand-off tier, and the
one-shot creates and background responses over them. Runs and streams get them as one typed
bundle (``runs.deps.RunDeps``); the facade (``ResponsesCore``, built by ``build_core``) keeps
only what it serves. Tests pass fakes in here (an engine factory) rather than overriding the
core.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

import tiktoken

from .config import RouteConfig, ServerConfig
from .core import TransportNaming, TransportPort
from .core.conversation.state import MemoryBudget
from .core.lanes import StreamNaming
from .core.observability.counters import Counters
from .core.observability.metrics import Metrics
from .core.one_shot import OneShotOps
from .core.ports import Engine
from .core.process.activity import Activity
from .core.process.malloc_trim import IdleTrimmer
from .core.rendering.render import Renderer
from .core.rendering.tokenizer import load_encoding
from .core.runs.background import BackgroundRuns
from .core.runs.compaction import CompactionCodec, load_key
from .core.runs.deps import RunDeps, ServerState
from .core.runs.one_shot import OneShotRuns
from .core.runs.routing import Router
from .core.service import CoreParts, ResponsesCore
from .core.storage.backend import open_store
from .core.storage.handoff import StateTier
from .core.storage.journal import Journal
from .core.storage.postinference import PostQueue
from .core.tenancy.auth import ApiKeys
from .core.tenancy.limits import TenantLimiter
from .core.tenancy.request_budget import RequestBytes
from .engines import build_engine
from .pipeline import build_pipeline

#: Builds the engine of one model route (the router calls it once per route).
EngineFactory = Callable[[RouteConfig], Engine]


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
        write_linger_s=durability.write_linger_ms / 1000,
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


def build_core(
    config: ServerConfig,
    *,
    encoding: tiktoken.Encoding | None = None,
    engine_factory: EngineFactory | None = None,
) -> ResponsesCore:
    """The core over parts composed from ``config`` (arguments as ``compose``)."""
    return ResponsesCore(config, compose(config, encoding=encoding, engine_factory=engine_factory))


# How each transport names what the core reports on it, and what its requests cost: data
# handed to it, not branches in the core. WebSocket mode keeps the hosted API's codes; the
# other transports get neutral names. Copies: of a request held at once while it is read and
# parsed (an HTTP body: the buffer as it grows, then its parsed form; a WebSocket frame: the
# parser's buffer, the payload cut from it, unmasked, then its decoded text; a gRPC message:
# the bytes grpc hands over, the protobuf message, its dict). Charging that many times the
# wire bytes makes the request budget bound memory, not just bytes on the wire. (gRPC's own
# buffer of a message being received is out of the application's reach: docs/results.md.)
GRPC_NAMING = TransportNaming(
    stream=StreamNaming("grpc"), one_shot="grpc-unary", stream_copies=3, one_shot_copies=3
)
HTTP_NAMING = TransportNaming(
    stream=StreamNaming(
        "websocket",
        lane_limit_code="websocket_stream_limit_reached",
        age_limit_prefix="websocket_connection_limit",
    ),
    one_shot="http",
    stream_copies=4,
    one_shot_copies=3,
)


def transport_port(core: ResponsesCore, naming: TransportNaming) -> TransportPort:
    """What a transport named ``naming`` is handed of ``core``."""
    return TransportPort(
        streams=core,
        one_shot=core,
        naming=naming,
        keys=core.keys,
        limits=core.config.limits,
        streaming=core.config.streaming,
        metrics=core.metrics,
        counters=core.counters,
        request_bytes=core.request_bytes,
        on_drain=core.drain_hooks.append,
    )
