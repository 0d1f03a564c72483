"""What the benchmarks, cluster tools and tests share to start servers and helper processes.

A nearly free simulated engine (so that what differs between runs is the API's own work),
an in-process server config on free ports around it, and the ``serve`` command line of a
server subprocess.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from bidi_responses.server.config import RouteConfig, ServerConfig
from bidi_responses.server.engine_config import SimConfig

__all__ = ["fast_sim", "serve_command", "sim_server_config"]


def fast_sim(*, tool_rounds: int, answer_tokens: int = 200) -> SimConfig:
    """A simulated engine that costs next to nothing: no time to first token, instant prefill.

    ``tool_rounds`` function-call turns come before a text answer of ``answer_tokens``.
    """
    return SimConfig(
        tokens_per_second=1_000_000,
        ttft_ms=0,
        prefill_tokens_per_second=1e9,
        tool_rounds=tool_rounds,
        function_call_tokens=40,
        answer_tokens=answer_tokens,
    )


def sim_server_config(data_dir: str | Path, sim: SimConfig) -> ServerConfig:
    """An in-process server config: free loopback ports, ``sim-model`` served by ``sim``."""
    config = ServerConfig(grpc_port=0, http_port=0, data_dir=str(data_dir))
    config.models = {"sim-model": RouteConfig(engine="sim", sim=sim)}
    return config


def serve_command(
    config: Path,
    *,
    grpc_port: int,
    http_port: int | None,
    data_dir: Path,
    extra: Sequence[str] = (),
) -> list[str]:
    """``bidi-responses serve`` as a subprocess command line (``http_port`` None: no HTTP)."""
    command = [
        sys.executable,
        "-m",
        "bidi_responses.server.cli",
        "serve",
        "--config",
        str(config),
        "--grpc-port",
        str(grpc_port),
        "--data-dir",
        str(data_dir),
    ]
    if http_port is None:
        command.append("--no-http")
    else:
        command += ["--http-port", str(http_port)]
    return [*command, *extra]
