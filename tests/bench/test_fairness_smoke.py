"""Small versions of ``make bench-fairness`` and ``make bench-memory`` (statuses and bounds,
never timings)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bidi_responses.bench.fairness import MIB, measure_latency, measure_memory


def test_small_stream_turns_go_on_while_huge_creates_run(tmp_path: Path) -> None:
    row = measure_latency(
        "run", 1_000_000, turns=20, seconds=0.5, workdir=tmp_path, offload_chars=None
    )
    assert row["idle_turns"] >= 20 and row["loaded_turns"] >= 20
    assert isinstance(row["big_creates"], int) and row["big_creates"] >= 1


@pytest.mark.parametrize("transport", ["http", "websocket", "grpc-unary", "grpc-connect"])
def test_parallel_near_limit_messages_are_refused_within_the_budget(
    transport: str, tmp_path: Path
) -> None:
    """Eight 16 MiB messages at once against a 16 MiB budget: each is refused with a 4xx
    (never a 5xx), the server lives, and on HTTP and WebSocket (where the server reads the
    bytes itself) its RSS grows by less than the budget plus 100 MB; without the budget it
    would hold every message two to four times over (256-512 MB)."""
    row = measure_memory(transport, 8, tmp_path, 16 * MIB, 16 * MIB)
    assert row["server_alive"] and row["no_5xx"], row
    assert sum(row["outcomes"].values()) == 8
    if transport in ("http", "websocket"):
        assert row["growth_mb"] <= row["target_mb"], row
