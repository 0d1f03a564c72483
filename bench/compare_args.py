"""The ``compare`` command's parsed arguments read into a ``CompareConfig``, and ``--smoke``.

Apart from the argument declarations (``cli``) so the checks and conversions of every sweep's
settings can be read, and tested, on their own.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .clients import ModeInfo
    from .run import CompareConfig

__all__ = ["EXTRA_SWEEPS", "SWEEPS", "config_from_args"]

SWEEPS = ("headline", "keepup", "history", "tps", "concurrency", "steer")
# Sweeps run only when asked for (``make compare-network``).
EXTRA_SWEEPS = ("network",)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x.strip()]


def _links(text: str) -> list[tuple[float, float | None]]:
    """RTT_MS:MBIT pairs (MBIT 0: unlimited)."""
    out: list[tuple[float, float | None]] = []
    for part in text.split(","):
        rtt, _, mbit = part.strip().partition(":")
        if rtt:
            out.append((float(rtt), float(mbit or 0) or None))
    return out


def _windows(text: str) -> list[float | None]:
    out: list[float | None] = []
    for part in text.split(","):
        part = part.strip()
        if part:
            out.append(None if part in ("off", "none") else float(part))
    return out


def _modes(text: str | None) -> list[ModeInfo] | None:
    """Modes from a list that may use ranges ("1-8,10"); None when empty."""
    from .clients import resolve_modes

    if not text:
        return None
    parts: list[str] = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if dash and low.isdigit() and high.isdigit():
            parts += [str(n) for n in range(int(low), int(high) + 1)]
        elif part.strip():
            parts.append(part.strip())
    return resolve_modes(parts)


def config_from_args(args: argparse.Namespace) -> CompareConfig:
    """A CompareConfig from parsed arguments."""
    from .clients import resolve_modes
    from .run import CompareConfig

    sweeps = [s.strip() for s in args.sweeps.split(",") if s.strip()]
    unknown = [s for s in sweeps if s not in SWEEPS + EXTRA_SWEEPS]
    if unknown:
        known = ", ".join(SWEEPS + EXTRA_SWEEPS)
        raise ValueError(f"unknown sweep(s) {unknown}; known: {known}")
    if args.backend_url:
        if args.sweeps != ",".join(SWEEPS) and sweeps != ["headline"]:
            raise ValueError("--backend-url runs the headline sweep only (--sweeps headline)")
        sweeps = ["headline"]  # the other sweeps vary the simulated engine's speed
    config = CompareConfig(
        modes=resolve_modes(args.modes),
        out_dir=Path(args.out),
        sweeps=sweeps,
        repeats=args.repeats,
        seed=args.seed,
        turns=args.turns,
        output_tokens=args.output_tokens,
        tool_ms=args.tool_ms,
        tps=args.tps,
        trace=args.trace,
        backend_url=args.backend_url,
        backend_model=args.backend_model,
        backend_api_key_env=args.backend_api_key_env,
        backend_format=args.backend_format,
        engine=args.engine,
        network_rtts=_floats(args.network_rtts),
        network_mbits=[m or None for m in _floats(args.network_mbits)],
        network_turns=args.network_turns,
        network_output_tokens=args.network_output_tokens,
        network_repeats=args.network_repeats,
        network_modes=_modes(args.network_modes),
        network_tls=not args.network_no_tls,
        network_mesh=_links(args.network_mesh),
        network_multiplex=_links(args.network_multiplex),
        network_lanes=_links(args.network_lanes),
        network_agents=args.network_agents,
        network_large=_links(args.network_large),
        network_llama=_links(args.network_llama),
        tps_values=_floats(args.tps_values),
        tps_turns=args.tps_turns,
        tps_modes=_modes(args.tps_modes),
        slow_modes=resolve_modes(args.slow_modes) if args.slow_modes else None,
        slow_repeats=args.slow_repeats,
        history_sizes=_ints(args.history_sizes),
        history_turns=args.history_turns,
        history_repeats=args.history_repeats or args.repeats,
        history_modes=_modes(args.history_modes),
        concurrency_workers=_ints(args.concurrency_workers),
        workers_modes=_modes(args.workers_modes),
        agents=_ints(args.agents),
        concurrency_turns=args.concurrency_turns,
        concurrency_modes=resolve_modes(args.concurrency_modes),
        concurrency_repeats=args.concurrency_repeats,
        concurrency_window=args.concurrency_window,
        concurrency_window_modes=resolve_modes(args.concurrency_window_modes)
        if args.concurrency_window_modes
        else None,
        keepup_windows=_windows(args.keepup_windows),
        keepup_modes=resolve_modes(args.keepup_modes),
        steer_rounds=args.steer_rounds,
        steer_modes=resolve_modes(args.steer_modes),
        store_all=args.store_all,
        malloc_tuned=args.malloc_tuned,
        show_progress=not args.no_progress,
        command=" ".join(shlex.quote(a) for a in ["bidi-responses", *sys.argv[1:]]),
    )
    if args.smoke:
        _smoke(config)
    return config


def _smoke(config: CompareConfig) -> None:
    """Shrink everything: a few turns of small outputs, one repeat, a fast engine."""
    from .clients import resolve_modes

    config.repeats = 1
    config.turns = 3
    config.output_tokens = 300
    config.tps = 4000.0
    config.ttft_ms = 5.0
    config.tps_values = [4000.0]
    config.tps_turns = 2
    config.tps_output_tokens = 300
    config.tps_modes = resolve_modes("1,7")
    config.history_sizes = [1000, 6000]
    config.history_turns = 2
    config.history_repeats = 1
    config.agents = [1, 3]
    config.concurrency_turns = 2
    config.concurrency_output_tokens = 300
    config.concurrency_modes = resolve_modes("4,7")
    config.concurrency_repeats = 1
    config.concurrency_window_modes = []
    config.concurrency_workers = [1, 2]
    config.workers_modes = resolve_modes("7")
    config.history_modes = None
    config.keepup_tokens = 400
    config.keepup_responses = 1
    config.keepup_windows = [0.0]
    config.keepup_modes = resolve_modes("7")
    config.steer_rounds = 3
    config.network_rtts = [20.0]
    config.network_mbits = [None]
    config.network_turns = 2
    config.network_output_tokens = 300
    config.network_repeats = 1
    config.network_mesh = [(20.0, None)]
    config.network_multiplex = [(20.0, None)]
    config.network_lanes = [(20.0, None)]
    config.network_agents = 3
    config.network_large = [(20.0, None)]
    config.network_large_turns = 1
    config.network_large_tokens = 20_000
    config.network_llama = [(20.0, None)]
    config.network_llama_turns = 1
