"""A bounded run of ``make fuzz`` and ``make soak`` inside ``make test``."""

from __future__ import annotations

from pathlib import Path

from bidi_responses.bench.soak import run_soak

from tests.fuzz.run import BAD, report, run_fuzz


def test_fuzz_smoke(tmp_path: Path) -> None:
    counts, state = run_fuzz(240, tmp_path)
    table, clean = report(counts, state)
    assert clean, table
    assert sum(sum(c.values()) for c in counts.values()) == 240
    assert all(counts[t].get(b, 0) == 0 for t in counts for b in BAD)


def test_soak_smoke(tmp_path: Path) -> None:
    summaries = run_soak(4, 3, ["grpc", "websocket", "http"], tmp_path)
    for summary in summaries:
        assert summary["responses"] == summary["expected"] == 12, summary
        assert summary["lost"] == summary["duplicated"] == summary["failed"] == 0, summary
        assert summary["ledger_rows"] == 12 and summary["server_alive"]
