"""``make peers`` in small: this project's side against the fake model always; SMG's cell when
its environment is installed (``make peers`` installs it), skipped with the reason otherwise."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from bidi_responses.bench.peers import MODES, main, run_peers
from bidi_responses.bench.report.peers import peers_section

SMG = Path(__file__).resolve().parents[2] / ".venv-peers" / "bin" / "smg"


def _check_cells(result: dict[str, object], server: str, turns: int) -> None:
    cells = result["cells"]
    assert isinstance(cells, dict)
    for mode in MODES[server]:
        cell = cells[f"{server}.{mode}"]
        assert cell["repeats"] == 1
        assert len(cell["per_turn_cpu_ms"]) == turns
        for figure in ("cpu_ms", "wall_ms", "model_ms"):
            for which in ("first", "last", "tool_turn"):
                assert cell[figure][which]["median"] >= 0, (mode, figure, which)
        # The server did work on every turn, and the model reported time of its own.
        assert cell["cpu_ms"]["tool_turn"]["median"] > 0
        assert cell["model_ms"]["tool_turn"]["median"] > 0


@pytest.mark.timeout(180)
def test_this_projects_side_of_the_peers_benchmark(tmp_path: Path) -> None:
    result = asyncio.run(asyncio.wait_for(run_peers(tmp_path, None, turns=3, repeats=1), 150))
    _check_cells(result, "bidi", 3)
    assert "smg" in result["skipped"]
    section = peers_section(result)
    assert "| this project | gRPC Connect |" in section
    assert "SMG: not measured (SMG is not installed" in section


@pytest.mark.timeout(240)
@pytest.mark.skipif(not SMG.is_file(), reason="SMG is not installed (make peers installs it)")
def test_smg_beside_this_project_in_peers_json(tmp_path: Path) -> None:
    args = ["--smg", str(SMG), "--turns", "3", "--repeats", "1", "--out", str(tmp_path)]
    assert main(args) == 0
    result = json.loads((tmp_path / "peers.json").read_text(encoding="utf-8"))
    assert result["skipped"] == {}
    _check_cells(result, "bidi", 3)
    _check_cells(result, "smg", 3)
    assert "a stateful turn at most SMG's pass-through turn" in peers_section(result)
