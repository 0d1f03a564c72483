"""A bounded run of the connections family of ``make fuzz`` inside ``make test``."""

from __future__ import annotations

from pathlib import Path

from tests.fuzz.connections import clean, run_connection_fuzz, summary


def test_fuzz_connections_smoke(tmp_path: Path) -> None:
    tally, state = run_connection_fuzz(4, tmp_path)
    assert clean(tally, state), summary(tally, state)
    assert tally.inputs == 4 and tally.checker_served == 4
