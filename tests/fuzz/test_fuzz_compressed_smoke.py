"""A bounded run of the compressed family of ``make fuzz`` inside ``make test``."""

from __future__ import annotations

from pathlib import Path

from tests.fuzz.compressed import clean_memory, run_compressed_fuzz
from tests.fuzz.run import BAD, report


def test_fuzz_compressed_smoke(tmp_path: Path) -> None:
    counts, state = run_compressed_fuzz(16, tmp_path)
    table, clean = report(counts, state)
    assert clean, (table, state["first_error"])
    assert clean_memory(state), state
    assert sum(sum(c.values()) for c in counts.values()) >= 16
    assert all(counts[t].get(b, 0) == 0 for t in counts for b in BAD)
