"""``run_compare``: every sweep a CompareConfig asks for, each as one or more cells."""

from __future__ import annotations

from collections.abc import Sequence

from ..clients import ModeInfo
from ..workload import load_trace_turns
from .cells import Runner
from .network import network_cell
from .settings import DEFAULT_DELTA_WINDOW_MS, CellResult, CompareConfig

__all__ = ["run_compare"]


def run_compare(config: CompareConfig) -> list[CellResult]:
    """Run every requested sweep; returns the raw cells (see ``report`` for the figures)."""
    runner = Runner(config)
    cells: list[CellResult] = []
    modes = config.modes
    try:
        if config.trace and config.turns != load_trace_turns(config.trace):
            config.turns = load_trace_turns(config.trace)
        if "headline" in config.sweeps:
            spec = config.workload_spec(config.turns, config.output_tokens)
            cells.append(
                runner.rollout_cell(
                    "headline", tps=config.tps, spec=spec, modes=modes, repeats=config.repeats
                )
            )
        if "keepup" in config.sweeps:
            keep = _subset(config.keepup_modes, modes, ("grpc_connect", "ws_cache"))
            if keep:
                cells.append(runner.keepup_cell(keep))
        if "history" in config.sweeps:
            cells.append(runner.history_cell(_subset(config.history_modes, modes, None)))
        if "tps" in config.sweeps:
            spec = config.workload_spec(config.tps_turns, config.tps_output_tokens)
            for tps in config.tps_values:
                slow = tps <= config.slow_tps
                chosen = (
                    _subset(config.slow_modes, modes, ("http_new", "ws_cache", "grpc_connect"))
                    if slow
                    else _subset(config.tps_modes, modes, None)
                )
                if not chosen:
                    continue
                cells.append(
                    runner.rollout_cell(
                        f"tps-{tps:g}",
                        tps=tps,
                        spec=spec,
                        modes=chosen,
                        repeats=config.slow_repeats if slow else config.repeats,
                    )
                )
        if "concurrency" in config.sweeps:
            chosen = _subset(
                config.concurrency_modes,
                modes,
                ("http_new", "http_keepalive", "ws_cache", "grpc_connect"),
            )
            for workers in config.concurrency_workers:
                if workers == 1:
                    if chosen:
                        cells.append(runner.concurrency_cell(chosen))
                    continue
                more = _subset(config.workers_modes, modes, ("ws_cache", "grpc_connect"))
                if more:
                    cells.append(
                        runner.concurrency_cell(
                            more, name=f"concurrency-workers{workers}", workers=workers
                        )
                    )
            extra = _subset(config.concurrency_window_modes, modes, ())
            if extra and config.concurrency_window != DEFAULT_DELTA_WINDOW_MS:
                # The same sweep with another delta merging window (by default 0: only deltas
                # already waiting are merged), to show what the default window does under load.
                window = config.concurrency_window
                cells.append(
                    runner.concurrency_cell(extra, name=f"concurrency-w{window:g}", window=window)
                )
        if "network" in config.sweeps:
            chosen = _subset(
                config.network_modes,
                modes,
                ("http_new", "http_keepalive", "ws_cache", "grpc_connect"),
            )
            if chosen:
                cells.append(network_cell(runner, chosen))
        if "steer" in config.sweeps:
            chosen = _subset(config.steer_modes, modes, ("ws_cache", "grpc_connect"))
            # Steering exists on the streams only (WebSocket mode and Connect).
            chosen = [m for m in chosen if m.transport != "http" and m.history == "chain"]
            if chosen:
                cells.append(runner.steer_cell(chosen))
    finally:
        runner.close()
    return cells


def _subset(
    explicit: list[ModeInfo] | None, modes: Sequence[ModeInfo], default: tuple[str, ...] | None
) -> list[ModeInfo]:
    """The explicit list if given, else ``default`` keys among ``modes`` (None: all)."""
    if explicit is not None:
        return [m for m in explicit if m in modes]
    if default is None:
        return list(modes)
    return [m for m in modes if m.key in default]
