"""The client worker processes: started on first use, sent commands, their results gathered."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnContext
from typing import cast, overload

from ..clients import (
    AgentsCommand,
    AgentsResult,
    KeepupCommand,
    KeepupResult,
    SteerCommand,
    SteerResult,
    worker_main,
)

__all__ = ["Worker", "WorkerError", "WorkerPool"]


class WorkerError(RuntimeError):
    """A client worker reported a failure."""


class Worker:
    """One client process and the pipe to it."""

    def __init__(self, ctx: SpawnContext, index: int) -> None:
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

    @overload
    def run(
        self,
        jobs: Sequence[tuple[Worker, AgentsCommand]],
        progress: Callable[[int], None] | None = None,
    ) -> list[AgentsResult]: ...

    @overload
    def run(
        self,
        jobs: Sequence[tuple[Worker, KeepupCommand]],
        progress: Callable[[int], None] | None = None,
    ) -> list[KeepupResult]: ...

    @overload
    def run(
        self,
        jobs: Sequence[tuple[Worker, SteerCommand]],
        progress: Callable[[int], None] | None = None,
    ) -> list[SteerResult]: ...

    def run(
        self,
        jobs: Sequence[tuple[Worker, AgentsCommand]]
        | Sequence[tuple[Worker, KeepupCommand]]
        | Sequence[tuple[Worker, SteerCommand]],
        progress: Callable[[int], None] | None = None,
    ) -> list[AgentsResult] | list[KeepupResult] | list[SteerResult]:
        """Send each worker its command at once; wait for all results (in job order)."""
        for worker, cmd in jobs:
            worker.conn.send(cmd)
        results: dict[int, AgentsResult | KeepupResult | SteerResult] = {}
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
        ordered = [results[i] for i in range(len(jobs))]
        # The pipe carries pickled dicts; each has the shape its command's result has.
        return cast("list[AgentsResult] | list[KeepupResult] | list[SteerResult]", ordered)

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
