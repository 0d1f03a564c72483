"""The soak's server settings: the sim engine's prefix-cache size reaches the server."""

from __future__ import annotations

from pathlib import Path

import pytest
from bidi_responses.bench.soak import SoakSettings, main, prefix_cache_note
from bidi_responses.server.config import load_config
from bidi_responses.server.engine_config import SimConfig
from bidi_responses.server.engines.sim import PREFIX_BLOCK_BYTES


def test_soak_sets_the_sim_prefix_cache_size(tmp_path: Path) -> None:
    path = tmp_path / "server.toml"
    for blocks in (0, 1024, SimConfig().prefix_cache_max_blocks):
        path.write_text(SoakSettings(prefix_cache_max_blocks=blocks).toml(), encoding="utf-8")
        route = load_config(path).models["sim-model"]
        assert route.sim.prefix_cache_max_blocks == blocks
        assert route.sim.tool_rounds == SoakSettings().tool_rounds


def test_prefix_cache_note_states_the_heap_it_may_hold() -> None:
    assert "off" in prefix_cache_note(0)
    note = prefix_cache_note(65_536)
    assert "65,536 blocks" in note
    assert f"~{65_536 * PREFIX_BLOCK_BYTES / 2**20:.1f} MiB" in note


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rounds", "0"], "--rounds must be >= 1, got 0"),
        (["--sim-prefix-blocks", "-1"], "--sim-prefix-blocks must be >= 0, got -1"),
    ],
)
def test_bad_arguments_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
