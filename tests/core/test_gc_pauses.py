"""The garbage collector's pauses on ``/metrics``, and the startup heap a served process
freezes out of them."""

from __future__ import annotations

import asyncio
import gc
import re
from pathlib import Path

import aiohttp
from bidi_responses.bench.ports import free_port
from bidi_responses.server.core.observability.metrics import Metrics

from tests.pipeline.server_process import serve_process

TIMEOUT_S = 60


def _pauses(metrics: Metrics, generation: int) -> float:
    """How many collections of ``generation`` the metrics timed."""
    scraped = metrics.scrape().decode()
    match = re.search(rf'bidi_gc_pause_seconds_count{{generation="{generation}"}} (\S+)', scraped)
    return float(match.group(1)) if match else 0.0


def test_each_collection_is_timed_while_started_and_none_after() -> None:
    metrics = Metrics(lambda model: True)
    metrics.gc_timer.start()
    try:
        gc.collect()
        gc.collect(0)
        assert _pauses(metrics, 2) == 1 and _pauses(metrics, 0) >= 1
        metrics.gc_timer.start()  # started twice: still one timer
        gc.collect()
        assert _pauses(metrics, 2) == 2
    finally:
        metrics.gc_timer.stop()
    gc.collect()
    assert _pauses(metrics, 2) == 2


async def test_a_served_process_freezes_its_startup_heap_and_times_the_collection(
    tmp_path: Path,
) -> None:
    http_port = free_port()
    async with (
        asyncio.timeout(TIMEOUT_S),
        serve_process(tmp_path / "data", http_port=http_port),
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{http_port}/metrics") as reply,
    ):
        scraped = await reply.text()
    frozen = re.search(r"^bidi_gc_frozen_objects (\S+)$", scraped, re.MULTILINE)
    assert frozen is not None
    # Modules, the tokenizer, routes and grpc: tens of thousands of objects.
    assert float(frozen.group(1)) > 10_000
    # The full collection before freezing was timed.
    full = re.search(r'^bidi_gc_pause_seconds_count{generation="2"} (\S+)$', scraped, re.M)
    assert full is not None and float(full.group(1)) >= 1
