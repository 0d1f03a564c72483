"""``compare --backend-url``: the benchmark's rollout against a real backend (llama.cpp).

A smoke run: two modes, two tool turns, the Harmony format. It checks that the rollout
completes on a real model (the forced tool choice makes the model call the tool every tool
turn) and that the report carries the backend's own engine time per turn. Timings are not
asserted.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from tests.llama.conftest import LlamaBackend


def test_compare_runs_the_rollout_on_a_real_backend(
    tmp_path: Path, llama_backend: LlamaBackend
) -> None:
    out = tmp_path / "compare"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bidi_responses.server.cli",
            "compare",
            "--backend-url",
            llama_backend.base_url,
            "--backend-format",
            "harmony",
            "--modes",
            "1,7",
            "--turns",
            "2",
            "--output-tokens",
            "100",
            "--repeats",
            "1",
            "--no-plots",
            "--no-progress",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "turns.csv", encoding="utf-8") as handle:
        turns = [row for row in csv.DictReader(handle) if row["cell"] == "headline"]
    by_mode = {
        mode: [t for t in turns if t["mode"] == mode] for mode in ("http_new", "grpc_connect")
    }
    for rows in by_mode.values():
        assert len(rows) == 3  # two tool turns, then the turn after the last output
        assert all(float(row["engine_ms"]) > 0 for row in rows)
        assert all(int(row["prefill_tokens"]) > 0 for row in rows)
    # The stream cache rendered only the new items; full history rendered it all again.
    last = {mode: int(rows[-1]["tokens_rendered"]) for mode, rows in by_mode.items()}
    assert last["grpc_connect"] < last["http_new"]
