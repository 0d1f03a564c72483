"""Prometheus metrics of one server (``prometheus-client``), scraped from the HTTP listener.

Each core has its own registry, so several servers in one process (tests) do not mix. Label
values are bounded: ``model`` is a configured alias or "unknown", ``code`` is a server-chosen
error code, never client text. With ``serve --workers N`` each worker process serves its own
registry; scrape each worker (or sum them in Prometheus).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from bidi_responses.codec.aio_wakeups import completion_reader
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from .gc_pauses import GcPauseTimer
from .ratelimit import SuppressedLines

if TYPE_CHECKING:
    from .stats import ResponseStats

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

# Seconds: from sub-millisecond cached turns to multi-minute agent turns.
_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)
# Seconds: a young generation's collection takes about a millisecond, a full one tens.
_GC_PAUSE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Metrics:
    """The server's instruments; the core and transports call the small methods below."""

    def __init__(self, is_known_model: Callable[[str], bool]) -> None:
        self._is_known_model = is_known_model
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "bidi_requests",
            "Create requests received, by transport and model.",
            ["transport", "model"],
            registry=r,
        )
        self.responses = Counter(
            "bidi_responses",
            "Responses that reached a terminal state, by transport, model and status.",
            ["transport", "model", "status"],
            registry=r,
        )
        self.errors = Counter(
            "bidi_errors",
            "Errors sent to clients (error events, error statuses), by transport, status and code.",
            ["transport", "status", "code"],
            registry=r,
        )
        self.open_streams = Gauge(
            "bidi_open_streams",
            "Open Connect streams and WebSocket connections.",
            ["transport"],
            registry=r,
        )
        self.open_lanes = Gauge(
            "bidi_open_lanes", "Open lanes (stream_id) over all streams.", registry=r
        )
        self.cache_hits = Counter(
            "bidi_cache_hits", "previous_response_id found in the stream cache.", registry=r
        )
        self.cache_misses = Counter(
            "bidi_cache_misses",
            "previous_response_id not in the stream cache (resolved from the store, or not found).",
            registry=r,
        )
        self.cache_evictions = Counter(
            "bidi_cache_evictions", "Conversation states evicted from stream caches.", registry=r
        )
        self.tokens_rendered = Counter(
            "bidi_tokens_rendered", "Prompt tokens rendered (tokenized).", registry=r
        )
        self.tokens_reused = Counter(
            "bidi_tokens_reused", "Prompt tokens reused from stream caches.", registry=r
        )
        self.prompt_rerenders = Counter(
            "bidi_prompt_rerenders",
            "Turns whose chat template rendered earlier turns differently (cached prompt "
            "tokens were no longer a prefix).",
            ["format"],
            registry=r,
        )
        self.turn_latency = Histogram(
            "bidi_turn_latency_seconds",
            "From a create's arrival to its terminal event.",
            ["transport", "model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "bidi_ttft_seconds",
            "From a create's arrival to its first output delta.",
            ["transport", "model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.post_queue_depth = Gauge(
            "bidi_post_queue_depth", "Post-inference jobs (ledger, store) waiting.", registry=r
        )
        self.token_repairs = Counter(
            "bidi_backend_token_repairs",
            "Sampled token ids a backend's report did not carry, by how the completions route "
            "got them back: recovered_ids (from the bytes of the next entry, a character split "
            "across tokens) or retokenized (text with no ids, tokenized again).",
            ["model", "kind"],
            registry=r,
        )
        self.limited = Counter(
            "bidi_limit_rejections",
            "Requests refused by a per-tenant or per-connection limit, by limit.",
            ["limit"],
            registry=r,
        )
        self.open_connections = Gauge(
            "bidi_open_connections",
            "Client connections held by a listener (HTTP: HTTP and WebSocket mode).",
            ["transport"],
            registry=r,
        )
        self.connection_limit = Gauge(
            "bidi_connection_limit",
            "Configured connection limits in force (scope: server, peer).",
            ["transport", "scope"],
            registry=r,
        )
        self.descriptor_limit = Gauge(
            "bidi_descriptor_limit",
            "The process's descriptor limit (RLIMIT_NOFILE, soft) after start-up raised it.",
            registry=r,
        )
        self.connections_refused = Counter(
            "bidi_connections_refused",
            "Connections refused by a connection limit or for want of descriptors, by reason "
            "(peer, server, descriptors).",
            ["transport", "reason"],
            registry=r,
        )
        r.register(SuppressedLines())
        r.register(_GrpcWakeups())
        self.gc_pauses = Histogram(
            "bidi_gc_pause_seconds",
            "Pauses of this process's garbage collector (every stream waits), by generation "
            "(2: a full collection).",
            ["generation"],
            buckets=_GC_PAUSE_BUCKETS,
            registry=r,
        )
        frozen = Gauge(
            "bidi_gc_frozen_objects",
            "Objects of the startup heap moved out of the garbage collector's walks.",
            registry=r,
        )
        frozen.set_function(gc.get_freeze_count)
        #: Started and stopped with the core (``ResponsesCore.start``, ``close``).
        self.gc_timer = GcPauseTimer(self.gc_pauses)

    def model(self, name: object) -> str:
        """A bounded label for a requested model: the alias if configured, else "unknown"."""
        return name if isinstance(name, str) and self._is_known_model(name) else "unknown"

    def error(self, transport: str, status: int, code: str | None) -> None:
        """Count one error sent to a client."""
        self.errors.labels(transport, str(status), code or "unknown").inc()

    def scrape(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)


# An engine segment's report key of each token repair, and its label.
_TOKEN_REPAIRS = (("recovered_ids", "recovered_ids"), ("retokenized_tokens", "retokenized"))


class _GrpcWakeups(Collector):
    """grpc.aio's completion wake-up bytes read at once on this process's event loop
    (``codec.aio_wakeups``): each would have cost a turn of the loop, and a rising count says
    completions queue up behind a busy loop. Read when scraped, from the loop's thread."""

    def describe(self) -> list[CounterMetricFamily]:
        # (Registered with nothing to describe: collecting reads the running loop's reader.)
        return []

    def collect(self) -> Iterator[CounterMetricFamily]:
        try:
            reader = completion_reader(asyncio.get_running_loop())
        except RuntimeError:  # scraped from outside the loop: nothing to read
            return
        if reader is not None:
            yield CounterMetricFamily(
                "bidi_grpc_wakeups_drained",
                "grpc.aio completion wake-up bytes read at once instead of one per turn of "
                "the event loop (completions that queued behind a busy loop).",
                value=reader.drained_bytes,
            )


class ResponseMetrics:
    """The metrics of one response: counted when it arrives, its time to first token, and
    its outcome once it reaches a terminal state."""

    def __init__(self, metrics: Metrics, transport: str, model: object, received: float) -> None:
        self._metrics = metrics
        self._transport = transport
        self._received = received
        self.model_label = metrics.model(model)
        self._ttft_seen = False

    def arrived(self) -> None:
        """Count the request."""
        self._metrics.requests.labels(self._transport, self.model_label).inc()

    def first_delta(self) -> None:
        """Record time to first token, once per response."""
        if not self._ttft_seen:
            self._ttft_seen = True
            self._metrics.ttft.labels(self._transport, self.model_label).observe(
                time.perf_counter() - self._received
            )

    def engine_segment(self, extra: Mapping[str, object]) -> None:
        """What an engine segment reported beyond its figures (the completions route's token
        repairs)."""
        for key, kind in (
            ("recovered_ids", "recovered_ids"),
            ("retokenized_tokens", "retokenized"),
        ):
            count = extra.get(key)
            if isinstance(count, int) and count > 0:
                self._metrics.token_repairs.labels(self.model_label, kind).inc(count)

    def finished(self, status: str, stats: ResponseStats) -> None:
        """Metrics of a response that reached a terminal state."""
        metrics = self._metrics
        metrics.responses.labels(self._transport, self.model_label, status).inc()
        metrics.tokens_rendered.inc(stats.tokens_rendered)
        metrics.tokens_reused.inc(stats.tokens_reused)
        metrics.turn_latency.labels(self._transport, self.model_label).observe(
            time.perf_counter() - self._received
        )
