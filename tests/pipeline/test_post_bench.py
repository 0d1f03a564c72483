"""The post-inference benchmark runs end to end (slow: four server processes)."""

from __future__ import annotations

import asyncio
import math

import pytest
from bidi_responses.bench.post_inference import MODES, Settings, format_table, run_benchmark


@pytest.mark.slow
async def test_post_inference_benchmark_runs() -> None:
    async with asyncio.timeout(120):
        document = await run_benchmark(Settings(turns=3, repeats=1, tool_output_tokens=300))
    summaries = {s["mode"]: s for s in document["summaries"]}
    assert list(summaries) == list(MODES)
    for mode, summary in summaries.items():
        assert summary["turns"] == 3 and not math.isnan(summary["gap_p50_ms"]), mode
    # Every response's job was written by the queue (warm-up plus one rollout of 4 responses).
    assert summaries["queued"]["server_jobs_written"] == 8
    assert summaries["queued-slow"]["server_jobs_written"] == 8
    assert summaries["inline-slow"]["server_jobs_written"] is None
    assert "gap p50 ms" in format_table(document)
