"""The grpc.aio busy-loop reproducer, small: every write of every stream is timed and the
summary adds up. Correctness only; what it shows is the benchmark's
(``python -m bidi_responses.bench.aio_busy_loop``)."""

from __future__ import annotations

import pytest
from bidi_responses.bench.aio_busy_loop import Settings, measure

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("drain_wakeups", [False, True])
def test_every_write_is_timed_beside_the_load(drain_wakeups: bool) -> None:
    settings = Settings(
        streams=4,
        writes=3,
        gap_ms=1.0,
        burners=2,
        burn_ms=0.1,
        nap_ms=1.0,
        drain_wakeups=drain_wakeups,
    )
    figures = measure(settings, timeout_s=60)
    assert figures["writes"] == 12
    assert 0 < figures["write_p50_ms"] <= figures["write_p99_ms"] <= figures["write_max_ms"]
    assert 0 <= figures["slow_writes"] <= 12 and 0 <= figures["slow_streams"] <= 4
    assert figures["timer_late_max_ms"] >= figures["timer_late_p50_ms"]
