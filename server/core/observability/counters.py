"""Cumulative server counters, readable through the stats call of every transport."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TypedDict

from .stats import ResponseStats


class CounterTotals(TypedDict):
    """The counters' JSON form."""

    responses_total: int
    items_validated_total: int
    tokens_rendered_total: int
    tokens_reused_total: int
    engine_ms_total: float
    api_pre_ms_total: float
    api_post_ms_total: float
    stage_items_total: dict[str, int]
    stage_ms_total: dict[str, float]
    process_cpu_seconds: float
    write_timeouts_total: int


class ServerStats(CounterTotals):
    """The stats call's body: the counters, then which process this is and its queues."""

    worker_index: int
    workers: int
    worker_pid: int
    streams_open: int
    route_resolutions_total: int
    post_queue_depth: int
    post_queue: dict[str, int]
    cache: dict[str, int]
    failover: dict[str, int]


@dataclass(slots=True)
class Counters:
    """Totals over every finished response since the server started."""

    responses_total: int = 0
    items_validated_total: int = 0
    tokens_rendered_total: int = 0
    tokens_reused_total: int = 0
    engine_ms_total: float = 0.0
    api_pre_ms_total: float = 0.0
    api_post_ms_total: float = 0.0
    stage_items_total: dict[str, int] = field(default_factory=dict)
    stage_ms_total: dict[str, float] = field(default_factory=dict)
    # Streams cut off because the client stopped reading (write timeout).
    write_timeouts: int = 0

    def record(self, stats: ResponseStats) -> None:
        """Add one finished response's counters."""
        self.responses_total += 1
        self.items_validated_total += stats.items_validated
        self.tokens_rendered_total += stats.tokens_rendered
        self.tokens_reused_total += stats.tokens_reused
        self.engine_ms_total += stats.engine_ms
        self.api_pre_ms_total += stats.api_pre_ms
        self.api_post_ms_total += stats.api_post_ms
        for name, count in stats.stage_items.items():
            self.stage_items_total[name] = self.stage_items_total.get(name, 0) + count
        for name, ms in stats.stage_ms.items():
            self.stage_ms_total[name] = self.stage_ms_total.get(name, 0.0) + ms

    def snapshot(self) -> CounterTotals:
        """JSON form (the GetStats / GET /v1/stats body)."""
        times = os.times()
        return {
            "responses_total": self.responses_total,
            "items_validated_total": self.items_validated_total,
            "tokens_rendered_total": self.tokens_rendered_total,
            "tokens_reused_total": self.tokens_reused_total,
            "engine_ms_total": round(self.engine_ms_total, 3),
            "api_pre_ms_total": round(self.api_pre_ms_total, 3),
            "api_post_ms_total": round(self.api_post_ms_total, 3),
            "stage_items_total": dict(self.stage_items_total),
            "stage_ms_total": {k: round(v, 3) for k, v in self.stage_ms_total.items()},
            "process_cpu_seconds": round(times.user + times.system, 6),
            "write_timeouts_total": self.write_timeouts,
        }
