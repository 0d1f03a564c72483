"""``bidi-responses compare --smoke``: the harness end to end, on a tiny configuration.

The run starts real servers and client processes, so it checks what unit tests cannot: that
every mode completes its rollouts, that the files, table and plots are written, and that the
server's counters tell the story the comparison is about (stateful modes render and send only
the new input). Timings are not asserted: they depend on the machine.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from bidi_responses.bench.clients import MODES
from bidi_responses.bench.report.document import PLACEHOLDER, SECTIONS

from tests.conftest import run_cli

FULL = ("http_new", "http_keepalive", "grpc_create")
STATEFUL = ("ws_cache", "ws_append", "grpc_connect", "grpc_append")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    out = tmp_path_factory.mktemp("compare")
    proc = run_cli(
        "compare",
        "--smoke",
        "--no-progress",
        "--out",
        str(out),
        "--doc",
        str(out / "doc" / "results.md"),
    )
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    return out, results, proc.stdout


def _rows(results: dict[str, Any], name: str) -> dict[str, dict[str, Any]]:
    summary = next(s for s in results["summaries"] if s["name"] == name)
    return {row["mode"]: row for row in summary["rows"]}


def test_files_and_table(smoke: tuple[Path, dict[str, Any], str]) -> None:
    out, results, stdout = smoke
    for name in (
        "results.json",
        "turns.csv",
        "runs.csv",
        "summary.csv",
        "report.md",
        "report.txt",
        "overhead_vs_history.png",
        "e2e_vs_tps.png",
        "throughput_vs_concurrency.png",
        "headline.png",
        "keepup.png",
        "steering.png",
        "server_cpu_per_turn.png",
        "results.md",
        "doc/results.md",
        "doc/results/server_cpu_per_turn.png",
        "doc/results/headline.png",
    ):
        path = out / name
        assert path.is_file() and path.stat().st_size > 0, name
    assert (out / "overhead_vs_history.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "headline" in stdout and "Targets" in stdout
    for mode in MODES.values():
        assert mode.label in stdout
    assert results["meta"]["machine"]["nproc"]
    assert {t["id"] for t in results["targets"]} >= {
        "T1",
        "T2",
        "T4",
        "T5",
        "T6",
        "T7",
        "T8",
        "T9",
        "T10",
        "T11",
    }
    assert "network projection ON PAPER" in stdout
    assert "concurrency-workers2" in stdout and "2 worker processes" in stdout


def test_batching_and_slim_snapshots_show(smoke: tuple[Path, dict[str, Any], str]) -> None:
    _, results, _ = smoke
    rows = _rows(results, "headline")
    # One gRPC message per event without batching; fewer with it (created and in_progress
    # always travel together), on gRPC and on the non-standard WebSocket frames alike.
    assert rows["grpc_single"]["messages_per_turn"] == rows["grpc_single"]["events_per_turn"]
    for key in ("grpc_connect", "grpc_slim", "ws_batched"):
        assert rows[key]["messages_per_turn"] < rows[key]["events_per_turn"], key
    assert rows["ws_cache"]["messages_per_turn"] == rows["ws_cache"]["events_per_turn"]
    # Slim snapshots leave out the instructions and tools three times a turn.
    assert rows["grpc_slim"]["bytes_down_per_turn"] < rows["grpc_connect"]["bytes_down_per_turn"]
    workers = _rows(results, "concurrency-workers2")
    assert workers["grpc_connect"]["throughput_turns_s"] > 0
    assert workers["grpc_connect"]["server_cpu_ms_per_turn"] > 0


def test_every_mode_completes_the_same_rollout(smoke: tuple[Path, dict[str, Any], str]) -> None:
    _, results, _ = smoke
    head = next(c for c in results["cells"] if c["name"] == "headline")
    turns_per_mode = {}
    for run in head["runs"]:
        assert run["statuses"] == ["completed"], run
        turns_per_mode[run["mode"]] = run["responses"]
    # 3 tool turns and the final answer, whatever the transport.
    assert turns_per_mode == {key: 4 for key in MODES}


def test_counters_show_the_cache(smoke: tuple[Path, dict[str, Any], str]) -> None:
    _, results, _ = smoke
    rows = _rows(results, "headline")
    for full in FULL:
        for stateful in STATEFUL:
            # The stream cache renders only new input; full history renders everything again.
            assert (
                rows[stateful]["tokens_rendered_per_turn"] < rows[full]["tokens_rendered_per_turn"]
            ), (stateful, full)
            assert rows[stateful]["bytes_up_per_turn"] < rows[full]["bytes_up_per_turn"]
    for row in rows.values():
        assert row["turn_p50_ms"] > 0
        assert row["server_cpu_ms_per_turn"] > 0
        assert row["bytes_down_per_turn"] > 0
    # Append mode sends only tool outputs: no instructions or tools after the first turn.
    assert rows["grpc_append"]["bytes_up_per_turn"] < rows["grpc_connect"]["bytes_up_per_turn"]
    assert rows["ws_append"]["bytes_up_per_turn"] < rows["ws_cache"]["bytes_up_per_turn"]

    history = _rows_by_size(results)
    biggest = max(size for _, size in history)
    for full in FULL:
        for stateful in STATEFUL:
            assert (
                history[(stateful, biggest)]["tokens_rendered_per_turn"] * 5
                < history[(full, biggest)]["tokens_rendered_per_turn"]
            )


def _rows_by_size(results: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    summary = next(s for s in results["summaries"] if s["name"] == "history")
    return {(r["mode"], r["history_target"]): r for r in summary["rows"]}


def test_overhead_is_turn_time_minus_engine_time(smoke: tuple[Path, dict[str, Any], str]) -> None:
    _, results, _ = smoke
    head = next(c for c in results["cells"] if c["name"] == "headline")
    for turn in head["turns"]:
        assert turn["engine_ms"] > 0
        assert turn["overhead_ms"] == pytest.approx(turn["turn_ms"] - turn["engine_ms"])
        assert turn["ttft_ms"] is not None and 0 < turn["ttft_ms"] <= turn["turn_ms"]


def test_keepup_and_concurrency(smoke: tuple[Path, dict[str, Any], str]) -> None:
    _, results, _ = smoke
    keep = next(s for s in results["summaries"] if s["name"] == "keepup")
    (row,) = keep["rows"]
    assert row["tokens"] == 400
    assert 0.5 < row["delivery"] < 1.5
    conc = next(s for s in results["summaries"] if s["name"] == "concurrency")
    assert {(r["mode"], r["agents"]) for r in conc["rows"]} == {
        (m, n) for m in ("ws_cache", "grpc_connect") for n in (1, 3)
    }
    assert all(r["throughput_turns_s"] > 0 for r in conc["rows"])


def test_steering_rows(smoke: tuple[Path, dict[str, Any], str]) -> None:
    """Every steer is acknowledged and followed by a successor on both streams; the figures
    are there and ordered (the acknowledgement comes before the successor's first token).
    Timings themselves are not asserted."""
    _, results, stdout = smoke
    rows = _rows(results, "steer")
    assert set(rows) == {"ws_cache", "grpc_connect"}
    for row in rows.values():
        assert row["rounds"] == 3
        assert row["accepted"] == row["successors_completed"] == 3
        assert len(row["ack_ms"]) == len(row["successor_first_token_ms"]) == 3
        assert 0 < row["ack_p50_ms"] < row["successor_first_token_p50_ms"]
    # The table sits right after the network projection.
    network = stdout.index("network projection ON PAPER")
    steering = stdout.index("steering: 3 responses per mode")
    assert network < steering < stdout.index("pre-inference work", network)


def test_the_document_has_every_section_and_no_placeholder(
    smoke: tuple[Path, dict[str, Any], str],
) -> None:
    out, results, _ = smoke
    doc = (out / "doc" / "results.md").read_text(encoding="utf-8")
    headings = [line[3:] for line in doc.splitlines() if line.startswith("## ")]
    assert headings == list(SECTIONS)
    assert not PLACEHOLDER.search(doc) and "{{" not in doc and "}}" not in doc
    # Figures of this run are in it, with their spread, and every plot it links exists.
    head = _rows(results, "headline")
    assert f"{head['grpc_connect']['e2e_median_s']:.3f}" in doc
    assert "| T12 |" in doc and "| T15 |" in doc
    for link in PLOT_LINK.findall(doc):
        assert (out / "doc" / link).is_file(), link
    # The copy in the output folder links the plots beside it.
    beside = (out / "results.md").read_text(encoding="utf-8")
    for link in PLOT_LINK.findall(beside):
        assert (out / link).is_file(), link


def test_the_document_rebuilds_from_results_json(
    smoke: tuple[Path, dict[str, Any], str], tmp_path: Path
) -> None:
    """--from-results measures nothing and writes the same document from the same run."""
    out, _, _ = smoke
    again = tmp_path / "again.md"
    run_cli(
        "compare",
        "--from-results",
        str(out / "results.json"),
        "--out",
        str(tmp_path / "out"),
        "--no-plots",
        "--doc",
        str(again),
    )
    assert again.read_text(encoding="utf-8") == (out / "doc" / "results.md").read_text(
        encoding="utf-8"
    )


PLOT_LINK = re.compile(r"!\[[^\]]*\]\(([^)]+\.png)\)")
