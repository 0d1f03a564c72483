"""Smoke test of the compaction benchmark on a tiny rollout."""

from __future__ import annotations

import asyncio

from bidi_responses.bench.compaction import run
from bidi_responses.bench.workload import WorkloadSpec


async def test_compaction_benchmark_runs_and_compaction_shrinks_the_prompt() -> None:
    spec = WorkloadSpec(
        tool_turns=2, tool_output_tokens=300, user_tokens=100, instructions_tokens=100
    )
    async with asyncio.timeout(60):
        results = await run(spec, repeats=1)
    assert results["tool_turns"] == 2
    full = results["next_turn"]["full history"]["input_tokens"]
    compacted = results["next_turn"]["compacted"]["input_tokens"]
    assert 0 < compacted < full
    assert results["compact"]["items_kept"] == 2  # the user message and the compaction item
