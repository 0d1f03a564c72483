"""The Envoy configuration: Envoy itself accepts it, and the documented example is current."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from bidi_responses.cluster.envoy import envoy_binary, render_config

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "envoy-example.json"

pytestmark = pytest.mark.timeout(60)


def _example() -> dict[str, object]:
    return render_config(
        grpc_replicas=[("127.0.0.1", p) for p in (50061, 50062, 50063)],
        http_replicas=[("127.0.0.1", p) for p in (8061, 8062, 8063)],
        grpc_port=50051,
        http_port=8000,
        admin_port=9901,
    )


def test_the_documented_example_is_what_the_code_renders() -> None:
    assert json.loads(EXAMPLE.read_text()) == _example(), (
        "docs/envoy-example.json is stale: regenerate it with python -m "
        "bidi_responses.cluster.envoy (see docs/replicas.md)"
    )


def test_envoy_validates_the_configuration(tmp_path: Path) -> None:
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(_example()))
    result = subprocess.run(
        [str(envoy_binary()), "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK" in result.stdout + result.stderr
