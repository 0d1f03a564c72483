"""``make aiperf`` on a few requests: aiperf (offline) and the project's client on the same
bodies, both figures in aiperf.json. aiperf lives in its own environment (``make aiperf``
installs it); without it this test says so and skips."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from bidi_responses.bench.aiperf_check import main

AIPERF = Path(__file__).resolve().parents[2] / ".venv-aiperf" / "bin" / "aiperf"


@pytest.mark.timeout(240)
@pytest.mark.skipif(not AIPERF.is_file(), reason="aiperf is not installed (make aiperf)")
def test_aiperf_and_the_projects_client_agree_on_the_same_requests(tmp_path: Path) -> None:
    code = main(
        [
            "--aiperf",
            str(AIPERF),
            "--out",
            str(tmp_path),
            "--requests",
            "6",
            "--input-tokens",
            "300",
            "--output-tokens",
            "40",
            "--ttft-ms",
            "20",
        ]
    )
    assert code == 0, (tmp_path / "aiperf.log").read_text(encoding="utf-8")[-3000:]
    result = json.loads((tmp_path / "aiperf.json").read_text(encoding="utf-8"))
    rows = {row["figure"].split(",")[0]: row for row in result["rows"]}
    assert rows["requests completed"]["aiperf"].startswith("6/6 (0 error")
    assert rows["requests completed"]["own"] == "6/6"
    for client in ("aiperf", "own"):
        ttft = float(re.match(r"[\d.]+", rows["time to first token"][client]).group())  # type: ignore[union-attr]
        latency = float(re.match(r"[\d.]+", rows["request latency"][client]).group())  # type: ignore[union-attr]
        # The engine alone needs 20 ms to a first token, then 40 tokens at 1,000 tok/s.
        assert 20 <= ttft < latency, (client, ttft, latency)
        assert latency >= 20 + 39
    assert int(rows["`/metrics` scrapes during the run"]["aiperf"]) > 0
