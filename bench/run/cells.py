"""The cells of a comparison: rollouts, the history sweep, concurrency and keep-up.

A *cell* is one server configuration and one question. Repeats are interleaved (repeat 1 of
every mode, then repeat 2, ...) and the order of modes rotates between repeats, so slow drift
of a shared machine spreads over all modes instead of landing on whichever ran last.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from ..clients import AgentsCommand, KeepupCommand, ModeInfo, SteerCommand
from ..workload import HistoryWorkload, WorkloadSpec, build_history_workload
from .measure import Measurer, rotated
from .rows import keepup_run, steer_run
from .settings import (
    DEFAULT_DELTA_WINDOW_MS,
    CellResult,
    window_label,
)
from .workers import Worker

__all__ = ["Runner"]


class Runner(Measurer):
    """Runs the cells of a CompareConfig with one worker pool."""

    def rollout_cell(
        self, name: str, *, tps: float, spec: WorkloadSpec, modes: Sequence[ModeInfo], repeats: int
    ) -> CellResult:
        """Single-agent rollouts of ``spec`` through each mode, ``repeats`` times."""
        cfg = self.config
        workload = self.workload(spec)
        turns = spec.tool_turns
        settings = self.settings(modes, tokens_per_second=tps, tool_rounds=turns)
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
        total = (turns + 1) * len(modes) * repeats
        with self.timed(cell, total, name) as bar, self.server(name, settings) as server:
            assert server.address is not None
            base = self.rollout_cmd(workload, server.address)
            self.warm_up(modes, base)
            for repeat in range(repeats):
                for mode in rotated(modes, repeat):
                    bar.describe(f"{mode.key} r{repeat + 1}")
                    cmd: AgentsCommand = {
                        **base,
                        "mode": mode.key,
                        "repeat": repeat,
                        "nonce": f"{name}-{mode.key}-{repeat}-{cfg.seed}",
                    }
                    self.run_measured(
                        cell,
                        server,
                        [(self.worker(mode), cmd)],
                        bar.update,
                        {"mode": mode.key, "repeat": repeat},
                    )
        return cell

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
        settings = self.settings(modes, tokens_per_second=cfg.tps, tool_rounds=1_000_000)
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
        with self.timed(cell, total, "history") as bar, self.server("history", settings) as server:
            assert server.address is not None
            base: AgentsCommand = {
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
            self.warm_up(modes, {**base, "first_input": hw.history(1000)})
            # The same prefilled history for every mode and repeat: the engine's prefix
            # cache then charges them alike, and overhead excludes engine time anyway.
            firsts = {size: hw.history(size) for size in cfg.history_sizes}
            # Repeats outermost, so that every size is measured early and late in the run
            # and a slow spell of the machine does not land on one size only.
            for repeat in range(cfg.history_repeats):
                for size in cfg.history_sizes:
                    for mode in rotated(modes, repeat):
                        bar.describe(f"{size // 1000}k {mode.key} r{repeat + 1}")
                        cmd: AgentsCommand = {
                            **base,
                            "mode": mode.key,
                            "repeat": repeat,
                            "first_input": firsts[size],
                        }
                        self.run_measured(
                            cell,
                            server,
                            [(self.worker(mode), cmd)],
                            bar.update,
                            {"mode": mode.key, "repeat": repeat, "history_target": size},
                        )
        return cell

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
        spec = cfg.workload_spec(cfg.concurrency_turns, cfg.concurrency_output_tokens)
        workload = self.workload(spec)
        settings = self.settings(modes, tokens_per_second=cfg.tps, tool_rounds=spec.tool_turns)
        settings.delta_window_ms = window
        settings.workers = workers
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
        with self.timed(cell, total, name) as bar, self.server(name, settings) as server:
            assert server.address is not None
            base: AgentsCommand = {**self.rollout_cmd(workload, server.address), "bytes": False}
            self.warm_up(modes, base)
            # The first batch at a concurrency grows the server's and the clients' heaps and
            # opens their connections: measured, it took up to 2.5x the wall time and 1.5x
            # the server CPU of the next, and whichever mode ran first paid for it. One
            # unmeasured batch per mode at the largest concurrency first.
            for mode in modes:
                bar.describe(f"{max(cfg.agents)} agents {mode.key} warm-up")
                self.pool.run(self._agent_jobs(base, mode, max(cfg.agents), repeat=-1))
            for agents in cfg.agents:
                for repeat in range(cfg.concurrency_repeats):
                    for mode in rotated(modes, repeat):
                        bar.describe(f"{agents} agents {mode.key} r{repeat + 1}")
                        self.run_measured(
                            cell,
                            server,
                            self._agent_jobs(base, mode, agents, repeat=repeat),
                            bar.update,
                            {"mode": mode.key, "repeat": repeat, "agents": agents},
                        )
        return cell

    def _agent_jobs(
        self, base: AgentsCommand, mode: ModeInfo, agents: int, repeat: int
    ) -> list[tuple[Worker, AgentsCommand]]:
        """``agents`` agents of ``mode``, spread over the concurrency's client processes
        (``repeat`` -1: the unmeasured warm-up)."""
        procs = max(1, min(agents, self.config.concurrency_processes))
        jobs: list[tuple[Worker, AgentsCommand]] = []
        for p in range(procs):
            share = agents // procs + (1 if p < agents % procs else 0)
            job: AgentsCommand = {
                **base,
                "mode": mode.key,
                "repeat": repeat,
                "agents": share,
                "agent_base": p * 1000,
                "nonce": f"conc-{agents}-{mode.key}-{repeat}-{p}",
            }
            jobs.append((self.worker(mode, p), job))
        return jobs

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
        with self.timed(cell, total, "keep-up") as bar:
            for window in cfg.keepup_windows:
                policy = window_label(window)
                settings = self.settings(modes, tokens_per_second=cfg.keepup_tps, tool_rounds=0)
                settings.answer_tokens = cfg.keepup_tokens
                settings.coalesce_deltas = window is not None
                settings.delta_window_ms = window or 0.0
                name = "keepup-" + ("nocoalesce" if window is None else f"w{window:g}")
                with self.server(name, settings) as server:
                    assert server.address is not None
                    for mode in modes:
                        bar.describe(f"{policy} {mode.key}")
                        keep: KeepupCommand = {
                            "cmd": "keepup",
                            "server": server.address,
                            "mode": mode.key,
                            "responses": 1,
                        }
                        self.pool.run([(self.worker(mode), keep)])  # warm-up
                        keep["responses"] = cfg.keepup_responses
                        cpu0 = server.cpu_seconds()
                        engine0 = self.backend_cpu()
                        (result,) = self.pool.run([(self.worker(mode), keep)], bar.update)
                        cpu1 = server.cpu_seconds()
                        row = keepup_run(
                            mode.key, policy, window, cfg.keepup_tps, result, cpu1 - cpu0
                        )
                        row["engine_cpu_s"] = self.backend_cpu() - engine0
                        cell.runs.append(row)
        return cell

    def steer_cell(self, modes: Sequence[ModeInfo]) -> CellResult:
        """Steering per stream transport on one engine: steer sent -> acknowledgement, and
        steer sent -> the automatic successor's first token."""
        cfg = self.config
        settings = self.settings(modes, tokens_per_second=cfg.steer_tps, tool_rounds=0)
        settings.ttft_ms = cfg.steer_ttft_ms
        settings.answer_tokens = cfg.steer_answer_tokens
        cell = CellResult(
            "steer",
            "steer",
            {
                "rounds": cfg.steer_rounds,
                "ttft_ms": cfg.steer_ttft_ms,
                "tokens_per_second": cfg.steer_tps,
                "answer_tokens": cfg.steer_answer_tokens,
                "repeats": cfg.repeats,
                "modes": [m.key for m in modes],
            },
        )
        total = len(modes) * (cfg.steer_rounds * cfg.repeats + 1)
        with self.timed(cell, total, "steer") as bar, self.server("steer", settings) as server:
            assert server.address is not None
            base: SteerCommand = {
                "cmd": "steer",
                "server": server.address,
                "mode": "",
                "rounds": 1,
            }
            for mode in modes:  # warm-up: imports, the connection, the engine's prompt head
                self.pool.run([(self.worker(mode), {**base, "mode": mode.key})], bar.update)
            for repeat in range(cfg.repeats):
                for mode in rotated(modes, repeat):
                    bar.describe(f"{mode.key} r{repeat + 1}")
                    cmd: SteerCommand = {**base, "mode": mode.key, "rounds": cfg.steer_rounds}
                    (result,) = self.pool.run([(self.worker(mode), cmd)], bar.update)
                    cell.runs.append(steer_run(mode.key, repeat, result))
        return cell
