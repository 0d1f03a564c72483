"""Orchestration of ``bidi-responses compare``: servers, client workers, cells, repeats.

A *cell* is one server configuration and one question (the headline rollout, one point of a
sweep, the keep-up test). For each cell the orchestrator starts the server as a subprocess,
waits until it listens, and sends commands to client worker processes (``clients.worker_main``,
one per mode, started with ``spawn``). The server's CPU time is read (``cpu.py``) around each
run; nothing else runs on the server in between, so the difference is that run's cost.

Repeats are interleaved (repeat 1 of every mode, then repeat 2, ...) and the order of modes
rotates between repeats, so slow drift of a shared machine spreads over all modes instead of
landing on whichever ran last.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from bidi_responses.bench.clients import MODES, ModeInfo, ServerAddress, worker_main
from bidi_responses.bench.cpu import process_cpu_clock
from bidi_responses.bench.ports import free_port
from bidi_responses.bench.workload import (
    HistoryWorkload,
    Workload,
    WorkloadSpec,
    build_history_workload,
    build_workload,
    count_tokens,
    load_trace_turns,
)
from bidi_responses.server.config import StreamingConfig

__all__ = [
    "DEFAULT_DELTA_WINDOW_MS",
    "CellResult",
    "CompareConfig",
    "ServerProcess",
    "ServerSettings",
    "WorkerError",
    "WorkerPool",
    "run_compare",
]


#: The server's default delta merging window (ms): every cell runs with it unless it says not.
DEFAULT_DELTA_WINDOW_MS: float = StreamingConfig().delta_window_ms


def window_label(window: float | None) -> str:
    """How a delta merging policy is named in tables: off, or the window (and if default)."""
    if window is None:
        return "off"
    return f"window {window:g} ms" + (" (default)" if window == DEFAULT_DELTA_WINDOW_MS else "")


@dataclass(slots=True)
class ServerSettings:
    """One server configuration (written to a TOML file the server reads)."""

    tokens_per_second: float = 1000.0
    ttft_ms: float = 50.0
    prefill_tokens_per_second: float = 100_000.0
    tool_rounds: int = 25
    function_call_tokens: int = 40
    answer_tokens: int = 200
    seed: int = 0
    coalesce_deltas: bool = True
    delta_window_ms: float = DEFAULT_DELTA_WINDOW_MS
    engine: str = "sim"
    script_path: str | None = None
    http: bool = True
    workers: int = 1
    # A real backend (engine "completions"): its OpenAI base URL, model name, API key variable.
    backend_url: str | None = None
    backend_model: str = ""
    backend_api_key_env: str = ""
    backend_format: str = "generic"

    def toml(self) -> str:
        """The server's config file."""
        lines = [
            f"workers = {int(self.workers)}",
            "",
            "[streaming]",
            f"coalesce_deltas = {str(self.coalesce_deltas).lower()}",
            f"delta_window_ms = {float(self.delta_window_ms)!r}",
            "",
            '[models."sim-model"]',
            f'engine = "{self.engine}"',
        ]
        if self.script_path:
            lines.append(f"script_path = {_toml_str(self.script_path)}")
        if self.backend_url:
            lines[lines.index(f'engine = "{self.engine}"')] = 'engine = "completions"'
            lines += [
                "",
                '[models."sim-model".completions]',
                f"base_url = {_toml_str(self.backend_url)}",
                f"model = {_toml_str(self.backend_model)}",
                f"api_key_env = {_toml_str(self.backend_api_key_env)}",
                f"format = {_toml_str(self.backend_format)}",
            ]
        lines += [
            "",
            '[models."sim-model".sim]',
            f"tokens_per_second = {float(self.tokens_per_second)!r}",
            f"ttft_ms = {float(self.ttft_ms)!r}",
            f"prefill_tokens_per_second = {float(self.prefill_tokens_per_second)!r}",
            f"tool_rounds = {int(self.tool_rounds)}",
            f"function_call_tokens = {int(self.function_call_tokens)}",
            f"answer_tokens = {int(self.answer_tokens)}",
            f"seed = {int(self.seed)}",
        ]
        return "\n".join(lines) + "\n"


def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class ServerProcess:
    """``bidi-responses serve`` in a subprocess, on free loopback ports."""

    def __init__(
        self, settings: ServerSettings, workdir: Path, name: str, env: dict[str, str] | None = None
    ) -> None:
        self.settings = settings
        self.name = name
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "server.log"
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.address: ServerAddress | None = None
        self._cpu: Callable[[], float] | None = None

    def start(self, timeout: float = 60.0) -> ServerAddress:
        """Start and wait until every port accepts connections."""
        config = self.dir / "server.toml"
        config.write_text(self.settings.toml(), encoding="utf-8")
        grpc_port = free_port()
        http_port = free_port() if self.settings.http else None
        command = [
            sys.executable,
            "-m",
            "bidi_responses.server.cli",
            "serve",
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--grpc-port",
            str(grpc_port),
            "--data-dir",
            str(self.dir / "data"),
            "--log-level",
            # INFO only adds the start and stop lines; readiness is read from the first.
            "INFO",
        ]
        if http_port is not None:
            command += ["--http-port", str(http_port)]
        else:
            command.append("--no-http")
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child writes it until stop()
        self.proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        log.close()
        # With several workers the server is a process tree: its CPU time is the sum over the
        # tree, and no single pid can be read per turn.
        workers = self.settings.workers
        address = ServerAddress(
            "127.0.0.1", grpc_port, http_port, self.proc.pid if workers == 1 else None
        )
        deadline = time.monotonic() + timeout
        pending = list(address.ports)
        while pending or "listening" not in self.log_tail():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server {self.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"server {self.name} did not listen within {timeout:g} s:\n{self.log_tail()}"
                )
            if not pending:
                time.sleep(0.05)
                continue
            try:
                with socket.create_connection(("127.0.0.1", pending[0]), timeout=1):
                    pending.pop(0)
            except OSError:
                time.sleep(0.05)
        clocks = [process_cpu_clock(self.proc.pid)]
        if workers > 1:
            import psutil

            children = psutil.Process(self.proc.pid).children(recursive=True)
            clocks += [process_cpu_clock(child.pid) for child in children]
        self._cpu = lambda: sum(clock() for clock in clocks)
        self.address = address
        return address

    def log_tail(self, lines: int = 30) -> str:
        """The end of the server's log."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def cpu_seconds(self) -> float:
        """Server CPU time so far (user + system, all threads)."""
        assert self._cpu is not None
        return self._cpu()

    def stop(self) -> None:
        """SIGTERM (graceful), then SIGKILL if it does not exit."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class WorkerError(RuntimeError):
    """A client worker reported a failure."""


class Worker:
    """One client process and the pipe to it."""

    def __init__(self, ctx: Any, index: int) -> None:
        parent, child = ctx.Pipe()
        self.conn: Connection = parent
        self.index = index
        self.process = ctx.Process(
            target=worker_main, args=(child,), daemon=True, name=f"bench-client-{index}"
        )
        self.process.start()
        child.close()

    def close(self) -> None:
        """Ask the worker to exit, then make sure it did."""
        with contextlib.suppress(OSError, BrokenPipeError):
            self.conn.send(None)
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)


class WorkerPool:
    """Client worker processes, started on first use and reused across cells."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self._ctx = multiprocessing.get_context("spawn")
        self._workers: list[Worker] = []
        self._env = env

    def get(self, index: int) -> Worker:
        """Worker ``index`` (started if needed)."""
        while len(self._workers) <= index:
            with _env(self._env):
                self._workers.append(Worker(self._ctx, len(self._workers)))
        return self._workers[index]

    def run(
        self,
        jobs: Sequence[tuple[Worker, dict[str, Any]]],
        progress: Callable[[int], None] | None = None,
    ) -> list[dict[str, Any]]:
        """Send each worker its command at once; wait for all results (in job order)."""
        for worker, cmd in jobs:
            worker.conn.send(cmd)
        results: dict[int, dict[str, Any]] = {}
        errors: list[str] = []
        waiting = {worker.conn: i for i, (worker, _) in enumerate(jobs)}
        while waiting:
            for ready in wait(list(waiting)):
                assert isinstance(ready, Connection)
                try:
                    kind, payload = ready.recv()
                except (EOFError, OSError):
                    errors.append("a client worker died (see its traceback above)")
                    del waiting[ready]
                    continue
                if kind == "progress":
                    if progress is not None:
                        progress(int(payload))
                    continue
                index = waiting.pop(ready)
                if kind == "error":
                    errors.append(str(payload))
                else:
                    results[index] = payload
        if errors:
            raise WorkerError("\n".join(errors))
        return [results[i] for i in range(len(jobs))]

    def close(self) -> None:
        """Stop every worker."""
        for worker in self._workers:
            worker.close()
        self._workers.clear()


@contextlib.contextmanager
def _env(env: dict[str, str] | None) -> Iterator[None]:
    """Temporarily set environment variables (spawned children inherit them)."""
    if not env:
        yield
        return
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# -- configuration ------------------------------------------------------------------------


@dataclass(slots=True)
class CompareConfig:
    """Everything ``compare`` runs; the defaults are ``make compare``."""

    modes: list[ModeInfo]
    out_dir: Path
    sweeps: list[str] = field(
        default_factory=lambda: ["headline", "keepup", "history", "tps", "concurrency"]
    )
    repeats: int = 3
    seed: int = 0
    # Headline rollout.
    turns: int = 25
    output_tokens: int = 4000
    tool_ms: float = 0.0
    tps: float = 1000.0
    ttft_ms: float = 50.0
    trace: str | None = None
    # Run the rollouts against a real completions backend instead of the sim engine.
    backend_url: str | None = None
    backend_model: str = ""
    backend_api_key_env: str = ""
    backend_format: str = "generic"
    # tokens/s sweep (a shorter rollout).
    tps_values: list[float] = field(default_factory=lambda: [65.0, 1000.0, 4000.0])
    tps_turns: int = 10
    tps_output_tokens: int = 4000
    slow_tps: float = 100.0
    slow_modes: list[ModeInfo] | None = None
    slow_repeats: int = 1
    tps_modes: list[ModeInfo] | None = None
    # History-length sweep.
    history_sizes: list[int] = field(default_factory=lambda: [1000, 25_000, 100_000, 200_000])
    history_turns: int = 6
    history_small_tokens: int = 256
    history_repeats: int = 3
    history_modes: list[ModeInfo] | None = None
    # Concurrency sweep.
    agents: list[int] = field(default_factory=lambda: [1, 4, 16, 64])
    concurrency_turns: int = 5
    concurrency_output_tokens: int = 2000
    concurrency_modes: list[ModeInfo] | None = None
    concurrency_repeats: int = 2
    concurrency_processes: int = 2
    # The sweep runs once per server worker count; counts above 1 run ``workers_modes``.
    concurrency_workers: list[int] = field(default_factory=lambda: [1, 2])
    workers_modes: list[ModeInfo] | None = None
    # A second concurrency sweep with this window instead of the default (0: merge only what
    # is ready, the old default), for concurrency_window_modes; skipped if it is the default.
    concurrency_window: float = 0.0
    concurrency_window_modes: list[ModeInfo] | None = None
    # Keep-up test.
    keepup_tps: float = 4000.0
    keepup_tokens: int = 4000
    keepup_responses: int = 3
    keepup_modes: list[ModeInfo] | None = None
    keepup_windows: list[float | None] = field(
        default_factory=lambda: [None, 0.0, DEFAULT_DELTA_WINDOW_MS]
    )
    # Environment.
    store_all: bool = False
    malloc_tuned: bool = False
    show_progress: bool = True
    command: str = ""


@dataclass(slots=True)
class CellResult:
    """The raw outcome of one cell: its settings, one entry per run, every turn."""

    name: str
    kind: str
    params: dict[str, Any]
    runs: list[dict[str, Any]] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)


MALLOC_TUNED = "glibc.malloc.trim_threshold=268435456:glibc.malloc.mmap_threshold=268435456"


class _Progress:
    """A tqdm bar per cell (or nothing)."""

    def __init__(self, enabled: bool, total: int, desc: str) -> None:
        self._bar: Any = None
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


def _rotated(modes: Sequence[ModeInfo], repeat: int) -> list[ModeInfo]:
    shift = repeat % len(modes) if modes else 0
    return list(modes[shift:]) + list(modes[:shift])


class Runner:
    """Runs the cells of a CompareConfig with one worker pool."""

    def __init__(self, config: CompareConfig) -> None:
        self.config = config
        self.env = {"GLIBC_TUNABLES": MALLOC_TUNED} if config.malloc_tuned else None
        self.pool = WorkerPool(self.env)
        self.workdir = Path(tempfile.mkdtemp(prefix="bidi-compare-"))
        self.counter = count_tokens()
        self._workloads: dict[WorkloadSpec, Workload] = {}
        self.log: list[str] = []

    def close(self) -> None:
        """Stop workers and remove scratch files (server logs are copied out first)."""
        self.pool.close()
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

    def server(self, name: str, settings: ServerSettings) -> ServerProcess:
        """A server for one cell (HTTP only if an HTTP or WS mode is asked for)."""
        return ServerProcess(settings, self.workdir, name, self.env)

    # -- rollouts (headline and tokens/s sweep) ---------------------------------------------

    def rollout_cell(
        self, name: str, *, tps: float, spec: WorkloadSpec, modes: Sequence[ModeInfo], repeats: int
    ) -> CellResult:
        """Single-agent rollouts of ``spec`` through each mode, ``repeats`` times."""
        cfg = self.config
        workload = self.workload(spec)
        turns = spec.tool_turns
        settings = ServerSettings(
            tokens_per_second=tps,
            tool_rounds=turns,
            seed=cfg.seed,
            ttft_ms=cfg.ttft_ms,
            http=_needs_http(modes),
        )
        if cfg.trace:
            settings.engine = "script"
            settings.script_path = str(Path(cfg.trace).resolve())
        if cfg.backend_url:
            settings.backend_url = cfg.backend_url
            settings.backend_model = cfg.backend_model
            settings.backend_api_key_env = cfg.backend_api_key_env
            settings.backend_format = cfg.backend_format
        cell = CellResult(
            name,
            "rollout",
            {
                "tokens_per_second": tps,
                "workload": workload.to_json(),
                "server": asdict(settings),
                "repeats": repeats,
                "modes": [m.key for m in modes],
                "trace": cfg.trace,
                "backend_url": cfg.backend_url,
            },
        )
        started = time.perf_counter()
        bar = _Progress(cfg.show_progress, (turns + 1) * len(modes) * repeats, name)
        try:
            with self.server(name, settings) as server:
                assert server.address is not None
                base = self._rollout_cmd(workload, server.address)
                self._warm_up(modes, base)
                for repeat in range(repeats):
                    for mode in _rotated(modes, repeat):
                        bar.describe(f"{mode.key} r{repeat + 1}")
                        cmd = {
                            **base,
                            "mode": mode.key,
                            "repeat": repeat,
                            "nonce": f"{name}-{mode.key}-{repeat}-{cfg.seed}",
                        }
                        self._run_measured(
                            cell,
                            server,
                            [(self._worker(mode), cmd)],
                            bar.update,
                            {"mode": mode.key, "repeat": repeat},
                        )
        finally:
            bar.close()
        cell.params["duration_s"] = round(time.perf_counter() - started, 1)
        return cell

    def _rollout_cmd(self, workload: Workload, address: ServerAddress) -> dict[str, Any]:
        cmd = self._base_rollout_cmd(workload, address)
        if self.config.backend_url and workload.tools:
            # A real model decides for itself whether to call a tool; forcing the first tool
            # makes it run the workload's tool turns, so every mode does the same turns.
            cmd["tool_choice"] = {"type": "function", "name": workload.tools[0]["name"]}
            cmd["max_tool_turns"] = workload.spec.tool_turns
        return cmd

    def _base_rollout_cmd(self, workload: Workload, address: ServerAddress) -> dict[str, Any]:
        return {
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

    def _worker(self, mode: ModeInfo, slot: int = 0) -> Worker:
        # Worker i serves mode i (and i + 8 ... for a second process per mode).
        return self.pool.get((mode.number - 1) + len(MODES) * slot)

    def _warm_up(self, modes: Sequence[ModeInfo], base: dict[str, Any]) -> None:
        """A short unmeasured rollout per mode: imports, connections, the cached prompt head."""
        jobs = [
            (
                self._worker(m),
                {
                    **base,
                    "mode": m.key,
                    "max_tool_turns": 2,
                    "nonce": f"warmup-{m.key}",
                    "bytes": False,
                },
            )
            for m in modes
        ]
        for job in jobs:
            self.pool.run([job])

    def _run_measured(
        self,
        cell: CellResult,
        server: ServerProcess,
        jobs: list[tuple[Worker, dict[str, Any]]],
        progress: Callable[[int], None],
        tags: dict[str, Any],
    ) -> dict[str, Any]:
        """Run jobs in parallel, with the server's CPU time read around them."""
        cpu0 = server.cpu_seconds()
        try:
            results = self.pool.run(jobs, progress)
        except WorkerError as error:
            raise WorkerError(
                f"{error}\n-- server log ({server.name}):\n{server.log_tail()}"
            ) from None
        cpu1 = server.cpu_seconds()
        turns = [dict(t, **tags) for r in results for t in r["turns"]]
        measured = [t for t in turns if not t["setup"]]
        rollouts = [ro for r in results for ro in r["rollouts"]]
        t_start = min(r["t_start"] for r in results)
        t_end = max(r["t_end"] for r in results)
        run = {
            **tags,
            "server_cpu_s": cpu1 - cpu0,
            "client_cpu_s": sum(r["client_cpu_s"] for r in results),
            "wall_s": t_end - t_start,
            "responses": len(turns),
            "measured_turns": len(measured),
            "e2e_s": [ro["e2e_s"] for ro in rollouts],
            "statuses": sorted({ro["status"] for ro in rollouts}),
        }
        cell.runs.append(run)
        cell.turns.extend(turns)
        return run

    # -- history sweep ------------------------------------------------------------------------

    def history_cell(self, modes: Sequence[ModeInfo]) -> CellResult:
        """Per-turn overhead of small turns on top of histories of growing size."""
        cfg = self.config
        hw: HistoryWorkload = build_history_workload(
            cfg.seed,
            max_tokens=max(cfg.history_sizes),
            small_tokens=cfg.history_small_tokens,
            small_turns=cfg.history_turns,
            counter=self.counter,
        )
        # The model keeps calling tools however long the history is.
        settings = ServerSettings(
            tokens_per_second=cfg.tps,
            tool_rounds=1_000_000,
            seed=cfg.seed,
            ttft_ms=cfg.ttft_ms,
            http=_needs_http(modes),
        )
        cell = CellResult(
            "history",
            "history",
            {
                "tokens_per_second": cfg.tps,
                "sizes": cfg.history_sizes,
                "small_turns": cfg.history_turns,
                "small_tokens": cfg.history_small_tokens,
                "server": asdict(settings),
                "repeats": cfg.history_repeats,
                "modes": [m.key for m in modes],
            },
        )
        total = len(cfg.history_sizes) * len(modes) * cfg.history_repeats * (cfg.history_turns + 1)
        started = time.perf_counter()
        bar = _Progress(cfg.show_progress, total, "history")
        try:
            with self.server("history", settings) as server:
                assert server.address is not None
                base = {
                    "cmd": "agents",
                    "server": server.address,
                    "agents": 1,
                    "instructions": hw.instructions,
                    "tools": hw.tools,
                    "user_text": hw.user_text,
                    "tool_outputs": hw.small_outputs,
                    "store_all": cfg.store_all,
                    "bytes": True,
                    "setup_turns": 1,
                    "max_tool_turns": cfg.history_turns,
                }
                self._warm_up(modes, {**base, "first_input": hw.history(1000)})
                # The same prefilled history for every mode and repeat: the engine's prefix
                # cache then charges them alike, and overhead excludes engine time anyway.
                firsts = {size: hw.history(size) for size in cfg.history_sizes}
                # Repeats outermost, so that every size is measured early and late in the run
                # and a slow spell of the machine does not land on one size only.
                for repeat in range(cfg.history_repeats):
                    for size in cfg.history_sizes:
                        first = firsts[size]
                        for mode in _rotated(modes, repeat):
                            bar.describe(f"{size // 1000}k {mode.key} r{repeat + 1}")
                            cmd = {**base, "mode": mode.key, "repeat": repeat, "first_input": first}
                            self._run_measured(
                                cell,
                                server,
                                [(self._worker(mode), cmd)],
                                bar.update,
                                {"mode": mode.key, "repeat": repeat, "history_target": size},
                            )
        finally:
            bar.close()
        cell.params["duration_s"] = round(time.perf_counter() - started, 1)
        return cell

    # -- concurrency --------------------------------------------------------------------------

    def concurrency_cell(
        self,
        modes: Sequence[ModeInfo],
        name: str = "concurrency",
        window: float = DEFAULT_DELTA_WINDOW_MS,
        workers: int = 1,
    ) -> CellResult:
        """Many agents at once: throughput (turns/s) and latency as concurrency grows.

        ``window`` is the server's delta merging window (ms) and ``workers`` its process
        count (``serve --workers``) for this cell.
        """
        cfg = self.config
        spec = WorkloadSpec(
            seed=cfg.seed,
            tool_turns=cfg.concurrency_turns,
            tool_output_tokens=cfg.concurrency_output_tokens,
            tool_ms=cfg.tool_ms,
        )
        workload = self.workload(spec)
        settings = ServerSettings(
            tokens_per_second=cfg.tps,
            tool_rounds=spec.tool_turns,
            seed=cfg.seed,
            ttft_ms=cfg.ttft_ms,
            delta_window_ms=window,
            http=_needs_http(modes),
            workers=workers,
        )
        cell = CellResult(
            name,
            "concurrency",
            {
                "workers": workers,
                "delta_window_ms": window,
                "tokens_per_second": cfg.tps,
                "agents": cfg.agents,
                "workload": workload.to_json(),
                "server": asdict(settings),
                "repeats": cfg.concurrency_repeats,
                "processes": cfg.concurrency_processes,
                "modes": [m.key for m in modes],
            },
        )
        total = sum(cfg.agents) * len(modes) * cfg.concurrency_repeats * (spec.tool_turns + 1)
        started = time.perf_counter()
        bar = _Progress(cfg.show_progress, total, name)
        try:
            with self.server(name, settings) as server:
                assert server.address is not None
                base = {**self._rollout_cmd(workload, server.address), "bytes": False}
                self._warm_up(modes, base)
                for agents in cfg.agents:
                    procs = max(1, min(agents, cfg.concurrency_processes))
                    for repeat in range(cfg.concurrency_repeats):
                        for mode in _rotated(modes, repeat):
                            bar.describe(f"{agents} agents {mode.key} r{repeat + 1}")
                            jobs = []
                            for p in range(procs):
                                share = agents // procs + (1 if p < agents % procs else 0)
                                jobs.append(
                                    (
                                        self._worker(mode, p),
                                        {
                                            **base,
                                            "mode": mode.key,
                                            "repeat": repeat,
                                            "agents": share,
                                            "agent_base": p * 1000,
                                            "nonce": f"conc-{agents}-{mode.key}-{repeat}-{p}",
                                        },
                                    )
                                )
                            self._run_measured(
                                cell,
                                server,
                                jobs,
                                bar.update,
                                {"mode": mode.key, "repeat": repeat, "agents": agents},
                            )
        finally:
            bar.close()
        cell.params["duration_s"] = round(time.perf_counter() - started, 1)
        return cell

    # -- keep-up ------------------------------------------------------------------------------

    def keepup_cell(self, modes: Sequence[ModeInfo]) -> CellResult:
        """One stream at a fast engine: delivered tokens/s and server CPU, per delta policy."""
        cfg = self.config
        cell = CellResult(
            "keepup",
            "keepup",
            {
                "tokens_per_second": cfg.keepup_tps,
                "answer_tokens": cfg.keepup_tokens,
                "responses": cfg.keepup_responses,
                "windows": cfg.keepup_windows,
                "modes": [m.key for m in modes],
            },
        )
        total = len(cfg.keepup_windows) * len(modes) * cfg.keepup_responses
        started = time.perf_counter()
        bar = _Progress(cfg.show_progress, total, "keep-up")
        try:
            for window in cfg.keepup_windows:
                policy = window_label(window)
                settings = ServerSettings(
                    tokens_per_second=cfg.keepup_tps,
                    tool_rounds=0,
                    answer_tokens=cfg.keepup_tokens,
                    seed=cfg.seed,
                    ttft_ms=cfg.ttft_ms,
                    coalesce_deltas=window is not None,
                    delta_window_ms=window or 0.0,
                    http=_needs_http(modes),
                )
                name = "keepup-" + ("nocoalesce" if window is None else f"w{window:g}")
                with self.server(name, settings) as server:
                    assert server.address is not None
                    for mode in modes:
                        bar.describe(f"{policy} {mode.key}")
                        cmd = {
                            "cmd": "keepup",
                            "server": server.address,
                            "mode": mode.key,
                            "responses": 1,
                        }
                        self.pool.run([(self._worker(mode), cmd)])  # warm-up
                        cmd["responses"] = cfg.keepup_responses
                        cpu0 = server.cpu_seconds()
                        (result,) = self.pool.run([(self._worker(mode), cmd)], bar.update)
                        cpu1 = server.cpu_seconds()
                        cell.runs.append(
                            _keepup_run(
                                mode.key, policy, window, cfg.keepup_tps, result, cpu1 - cpu0
                            )
                        )
        finally:
            bar.close()
        cell.params["duration_s"] = round(time.perf_counter() - started, 1)
        return cell


def _keepup_run(
    mode: str,
    policy: str,
    window: float | None,
    tps: float,
    result: dict[str, Any],
    server_cpu_s: float,
) -> dict[str, Any]:
    rates = []
    deltas = []
    tokens = 0
    streaming_s = 0.0
    for r in result["responses"]:
        first, last = r["t_first_delta"], r["t_last_delta"]
        n = r["output_tokens"]
        tokens += n
        deltas.append(r["deltas"])
        if first is not None and last is not None and last > first:
            # n tokens arrive over (n - 1) token intervals from the first to the last delta.
            rates.append((n - 1) / (last - first))
            streaming_s += last - first
    wall = result["t_end"] - result["t_start"]
    return {
        "mode": mode,
        "policy": policy,
        "window_ms": window,
        "engine_tps": tps,
        "delivered_tps": sorted(rates)[len(rates) // 2] if rates else 0.0,
        "delivery": (sorted(rates)[len(rates) // 2] / tps) if rates else 0.0,
        "rates": rates,
        "tokens": tokens,
        "deltas_per_response": deltas,
        "tokens_per_message": tokens / max(sum(deltas), 1),
        "server_cpu_s": server_cpu_s,
        "wall_s": wall,
        "streaming_s": streaming_s,
        # Share of one core over the command (connection, TTFTs and streaming).
        "server_core_share": server_cpu_s / wall if wall > 0 else 0.0,
    }


def _needs_http(modes: Sequence[ModeInfo]) -> bool:
    return any(m.transport in ("http", "ws") for m in modes)


def run_compare(config: CompareConfig) -> list[CellResult]:
    """Run every requested sweep; returns the raw cells (see ``report`` for the figures)."""
    runner = Runner(config)
    cells: list[CellResult] = []
    modes = config.modes
    try:
        if config.trace and config.turns != load_trace_turns(config.trace):
            config.turns = load_trace_turns(config.trace)
        if "headline" in config.sweeps:
            spec = WorkloadSpec(
                seed=config.seed,
                tool_turns=config.turns,
                tool_output_tokens=config.output_tokens,
                tool_ms=config.tool_ms,
            )
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
            spec = WorkloadSpec(
                seed=config.seed,
                tool_turns=config.tps_turns,
                tool_output_tokens=config.tps_output_tokens,
                tool_ms=config.tool_ms,
            )
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
