"""``compare --backend-url``: the benchmark's rollout against a real backend (llama.cpp).

A smoke run: gRPC Connect, two tool turns, the Harmony format. It checks that the rollout
completes on a real model (the forced tool choice makes the model call the tool every tool
turn) and that the report carries the backend's own engine time per turn. Timings are not
asserted.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import pytest
from bidi_responses.bench.cli import add_compare
from bidi_responses.bench.compare_args import config_from_args
from bidi_responses.bench.run import ServerSettings
from bidi_responses.server.config import load_config

from tests.conftest import run_cli
from tests.llama.conftest import LlamaBackend


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_compare(parser.add_subparsers())
    return parser.parse_args(["compare", *argv])


def test_backend_flags_configure_a_completions_route(tmp_path: Path) -> None:
    config = config_from_args(
        _args("--backend-url", "http://gpu:8000/v1", "--backend-format", "harmony")
    )
    assert config.sweeps == ["headline"]
    settings = ServerSettings(
        backend_url=config.backend_url,
        backend_model="openai/gpt-oss-20b",
        backend_api_key_env="VLLM_API_KEY",
        backend_format=config.backend_format,
    )
    path = tmp_path / "server.toml"
    path.write_text(settings.toml(), encoding="utf-8")
    route = load_config(path).models["sim-model"]
    assert route.engine == "completions"
    assert route.completions.base_url == "http://gpu:8000/v1"
    assert route.completions.model == "openai/gpt-oss-20b"
    assert route.completions.api_key_env == "VLLM_API_KEY"
    assert route.completions.format == "harmony"
    with pytest.raises(ValueError, match="headline sweep only"):
        config_from_args(_args("--backend-url", "http://gpu:8000/v1", "--sweeps", "tps"))


@pytest.mark.slow  # about 20 s of process start-up: `make test-all`
def test_compare_runs_the_rollout_on_a_real_backend(
    tmp_path: Path, llama_backend: LlamaBackend
) -> None:
    out = tmp_path / "compare"
    run_cli(
        "compare",
        "--backend-url",
        llama_backend.base_url,
        "--backend-format",
        "harmony",
        "--modes",
        "7",
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
    )
    with open(out / "turns.csv", encoding="utf-8") as handle:
        turns = [row for row in csv.DictReader(handle) if row["cell"] == "headline"]
    rows = [t for t in turns if t["mode"] == "grpc_connect"]
    assert len(rows) == 3  # two tool turns, then the turn after the last output
    assert all(float(row["engine_ms"]) > 0 for row in rows)
    assert all(int(row["prefill_tokens"]) > 0 for row in rows)
    # The stream cache rendered only the new items after the first turn.
    assert all(int(row["tokens_reused"]) > 0 for row in rows[1:])
