"""Orchestration of ``bidi-responses compare``: servers, client workers, cells, repeats.

A *cell* is one server configuration and one question (the headline rollout, one point of a
sweep, the keep-up test). For each cell the orchestrator starts the server as a subprocess,
waits until it listens, and sends commands to client worker processes (``clients.worker_main``,
one per mode, started with ``spawn``). The server's CPU time is read (``cpu.py``) around each
run; nothing else runs on the server in between, so the difference is that run's cost.

Repeats are interleaved (repeat 1 of every mode, then repeat 2, ...) and the order of modes
rotates between repeats, so slow drift of a shared machine spreads over all modes instead of
landing on whichever ran last.

The package, one job per module: ``settings`` (what a run asks for), ``server`` (the server
subprocess), ``workers`` (the client processes), ``measure`` (the measurement loop), ``rows``
(results to rows), ``cells`` (one method per kind of cell) and ``compare`` (every sweep).
"""

from __future__ import annotations

from .cells import Runner
from .compare import run_compare
from .server import ServerProcess
from .settings import (
    DEFAULT_DELTA_WINDOW_MS,
    MALLOC_TUNED,
    CellResult,
    CompareConfig,
    ServerSettings,
    window_label,
)
from .workers import WorkerError, WorkerPool

__all__ = [
    "DEFAULT_DELTA_WINDOW_MS",
    "MALLOC_TUNED",
    "CellResult",
    "CompareConfig",
    "Runner",
    "ServerProcess",
    "ServerSettings",
    "WorkerError",
    "WorkerPool",
    "run_compare",
    "window_label",
]
