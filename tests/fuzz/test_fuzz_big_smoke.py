"""A bounded run of ``make fuzz-big`` inside ``make test``: huge inputs mixed with small
streams, every outcome an answer or a 4xx, and the small streams progress meanwhile."""

from __future__ import annotations

from pathlib import Path

from tests.fuzz.big import run_big_fuzz
from tests.fuzz.run import BAD, report


def test_fuzz_big_smoke(tmp_path: Path) -> None:
    counts, state = run_big_fuzz(4, tmp_path, chars=1_000_000)
    table, clean = report(counts, state)
    assert clean, (table, state["failures"])
    assert sum(sum(c.values()) for t, c in counts.items() if t.startswith("big ")) == 4
    assert all(counts[t].get(b, 0) == 0 for t in counts for b in BAD)
    # Small streams took turns while the huge inputs were being processed.
    assert state["small_turns_during"] > 0
