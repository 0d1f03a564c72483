"""Smoke version of ``make handoff-bench``: a small history, one run; the shape of the result."""

from __future__ import annotations

import asyncio

import pytest
from bidi_responses.bench.handoff import report, run
from bidi_responses.cluster.postgres import PostgresUnavailable, find_bin_dir

pytestmark = pytest.mark.timeout(90)


async def test_handoff_bench_runs() -> None:
    try:
        find_bin_dir()
    except PostgresUnavailable as error:
        pytest.skip(f"handoff bench not tested: {error}")
    async with asyncio.timeout(80):
        result = await run(6000, 1)
    (one,) = result["runs"]
    assert one["restored"]["items_validated"] == 1
    assert one["re-rendered"]["items_validated"] > 1
    assert one["restored"]["tokens_reused"] > 5000
    assert one["state_tokens"] >= one["restored"]["tokens_reused"]
    assert "| restored |" in report(result)
