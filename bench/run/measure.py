"""The measurement loop every cell shares: workloads, servers, warm-up, and measured runs.

A measured run sends each worker its command at once and reads the server's CPU time around
them; nothing else runs on the server in between, so the difference is that run's cost.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..clients import MODES, AgentsCommand, ModeInfo, ServerAddress
from ..jsontypes import JSONObject
from ..workload import Workload, WorkloadSpec, build_workload, count_tokens
from .backend import SimBackendProcess
from .rows import measured_run
from .server import ServerProcess
from .settings import (
    MALLOC_TUNED,
    CellResult,
    CompareConfig,
    ServerSettings,
)
from .workers import Worker, WorkerError, WorkerPool

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = ["Measurer", "Progress", "needs_http", "rotated"]


class Progress:
    """A tqdm bar per cell (or nothing)."""

    def __init__(self, enabled: bool, total: int, desc: str) -> None:
        self._bar: tqdm[None] | None = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total, desc=desc, unit="turn", dynamic_ncols=True, mininterval=0.3, leave=True
            )

    def update(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def describe(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def rotated(modes: Sequence[ModeInfo], repeat: int) -> list[ModeInfo]:
    """The modes in the order of ``repeat``: rotated by one per repeat, against drift."""
    shift = repeat % len(modes) if modes else 0
    return list(modes[shift:]) + list(modes[:shift])


def needs_http(modes: Sequence[ModeInfo]) -> bool:
    """True when a mode talks HTTP or WebSocket (else the server runs gRPC only)."""
    return any(m.transport in ("http", "ws") for m in modes)


class Measurer:
    """One worker pool, a scratch directory and the workloads, shared by every cell of a run."""

    def __init__(self, config: CompareConfig) -> None:
        self.config = config
        self.env = {"GLIBC_TUNABLES": MALLOC_TUNED} if config.malloc_tuned else None
        self.pool = WorkerPool(self.env)
        self.workdir = Path(tempfile.mkdtemp(prefix="bidi-compare-"))
        self.counter = count_tokens()
        self._workloads: dict[WorkloadSpec, Workload] = {}
        # The simulated engine's own process, shared by every cell's server (None: the sim
        # runs inside the server, or the engine is a trace or a real backend).
        self.backend: SimBackendProcess | None = None
        if config.engine == "process" and not config.trace and not config.backend_url:
            self.backend = SimBackendProcess(self.workdir, self.env)
            try:
                self.backend.start()
            except BaseException:
                self.backend.stop()
                self.pool.close()
                raise

    def close(self) -> None:
        """Stop workers and remove scratch files (server logs are copied out first)."""
        self.pool.close()
        if self.backend is not None:
            self.backend.stop()
        logs = self.config.out_dir / "logs"
        for path in self.workdir.glob("*/server.log"):
            logs.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, logs / f"{path.parent.name}.log")
        shutil.rmtree(self.workdir, ignore_errors=True)

    def workload(self, spec: WorkloadSpec) -> Workload:
        """Generated once per spec."""
        if spec not in self._workloads:
            self._workloads[spec] = build_workload(spec, self.counter)
        return self._workloads[spec]

    def settings(
        self, modes: Sequence[ModeInfo], *, tokens_per_second: float, tool_rounds: int
    ) -> ServerSettings:
        """A cell's server: the run's seed and TTFT; HTTP only if a mode needs it."""
        return ServerSettings(
            tokens_per_second=tokens_per_second,
            tool_rounds=tool_rounds,
            seed=self.config.seed,
            ttft_ms=self.config.ttft_ms,
            http=needs_http(modes),
            sim_backend_url=self.backend.base_url if self.backend is not None else None,
        )

    def backend_cpu(self) -> float:
        """The engine process's CPU time so far (0 when the engine runs in the server)."""
        return self.backend.cpu_seconds() if self.backend is not None else 0.0

    def server(self, name: str, settings: ServerSettings) -> ServerProcess:
        """A server for one cell."""
        return ServerProcess(settings, self.workdir, name, self.env)

    @contextlib.contextmanager
    def timed(self, cell: CellResult, total: int, desc: str) -> Iterator[Progress]:
        """A progress bar of ``total`` turns for the block; the cell's duration when it ends."""
        started = time.perf_counter()
        bar = Progress(self.config.show_progress, total, desc)
        try:
            yield bar
        finally:
            bar.close()
        cell.params["duration_s"] = round(time.perf_counter() - started, 1)

    def rollout_cmd(self, workload: Workload, address: ServerAddress) -> AgentsCommand:
        """The worker command of one agent rollout of ``workload``."""
        cmd: AgentsCommand = {
            "cmd": "agents",
            "server": address,
            "agents": 1,
            "instructions": workload.instructions,
            "tools": workload.tools,
            "user_text": workload.user_text,
            "tool_outputs": workload.tool_outputs,
            "tool_ms": workload.spec.tool_ms,
            "store_all": self.config.store_all,
            "bytes": True,
        }
        if self.config.backend_url and workload.tools:
            # A real model decides for itself whether to call a tool; forcing the first tool
            # makes it run the workload's tool turns, so every mode does the same turns.
            cmd["tool_choice"] = {"type": "function", "name": workload.tools[0]["name"]}
            cmd["max_tool_turns"] = workload.spec.tool_turns
        return cmd

    def worker(self, mode: ModeInfo, slot: int = 0) -> Worker:
        """The worker of ``mode`` (worker i serves mode i, and i + 8 ... for more processes)."""
        return self.pool.get((mode.number - 1) + len(MODES) * slot)

    def warm_up(self, modes: Sequence[ModeInfo], base: AgentsCommand) -> None:
        """A short unmeasured rollout per mode: imports, connections, the cached prompt head."""
        for m in modes:
            cmd: AgentsCommand = {
                **base,
                "mode": m.key,
                "max_tool_turns": 2,
                "nonce": f"warmup-{m.key}",
                "bytes": False,
            }
            self.pool.run([(self.worker(m), cmd)])

    def run_measured(
        self,
        cell: CellResult,
        server: ServerProcess,
        jobs: list[tuple[Worker, AgentsCommand]],
        progress: Callable[[int], None],
        tags: JSONObject,
        engine_cpu: Callable[[], float] | None = None,
    ) -> JSONObject:
        """Run jobs in parallel, with the server's CPU time read around them (and the
        engine's, from ``engine_cpu`` or else the run's own engine process)."""
        engine_clock = engine_cpu or self.backend_cpu
        cpu0 = server.cpu_seconds()
        engine0 = engine_clock()
        try:
            results = self.pool.run(jobs, progress)
        except WorkerError as error:
            raise WorkerError(
                f"{error}\n-- server log ({server.name}):\n{server.log_tail()}"
            ) from None
        cpu1 = server.cpu_seconds()
        run, turns = measured_run(tags, results, cpu1 - cpu0, engine_clock() - engine0)
        cell.runs.append(run)
        cell.turns.extend(turns)
        return run
