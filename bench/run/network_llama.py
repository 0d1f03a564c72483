"""The network sweep's real-engine cells: the rollout served by llama.cpp through a link.

The engine is llama.cpp itself (``bench.llama_backend``: the tiny generated model, its own
process, one slot and one thread), reached by a second server under test through its
production ``completions`` route in the Harmony format, as gpt-oss is served. The model
decides nothing here: the first tool is forced each tool turn (as ``compare --backend-url``
does), so every mode runs the same turns. The link sits between the clients and the server,
as in the rest of the sweep; llama.cpp stays on loopback.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ..clients import AgentsCommand, ModeInfo
from .backend import llama_backend_process
from .measure import Progress
from .network import relayed_rollouts

if TYPE_CHECKING:
    from .cells import Runner
    from .settings import CellResult

__all__ = ["llama_conditions"]


def llama_conditions(
    runner: Runner,
    cell: CellResult,
    modes: list[ModeInfo],
    tls: tuple[str, str] | None,
    ca: str | None,
    bar: Progress,
) -> None:
    """Every mode's rollout of the llama workload through each of ``network_llama``'s links,
    ``network_repeats`` times; llama.cpp's CPU is read per run, apart from the server's."""
    cfg = runner.config
    spec = cfg.workload_spec(cfg.network_llama_turns, cfg.network_llama_tokens)
    workload = runner.workload(spec)
    settings = runner.settings(modes, tokens_per_second=cfg.tps, tool_rounds=spec.tool_turns)
    settings.sim_backend_url = None
    if tls is not None:
        settings.tls_cert, settings.tls_key = tls
    with llama_backend_process(runner.workdir, runner.env) as engine:
        assert engine.base_url is not None
        settings.backend_url = engine.base_url
        settings.backend_format = "harmony"
        with runner.server("network-llama", settings) as server:
            assert server.address is not None
            direct = dataclasses.replace(server.address, tls_ca=ca)
            base: AgentsCommand = {
                **runner.rollout_cmd(workload, direct),
                "tool_choice": {"type": "function", "name": workload.tools[0]["name"]},
                "max_tool_turns": spec.tool_turns,
            }
            runner.warm_up(modes, base)
            relayed_rollouts(
                runner,
                cell,
                modes,
                server,
                direct,
                bar,
                base,
                cfg.network_llama,
                "llama",
                "llama.cpp",
                engine_cpu=engine.cpu_seconds,
            )
