"""``serve --workers N``: N server processes sharing the ports, the store and one log.

The supervisor (the process the user started) reserves the ports with ``SO_REUSEPORT``
sockets that it binds but never listens on, as grpc's Python multiprocessing example does, so
that port 0 resolves to one port for every worker. It prepares the database once (schema,
WAL), then starts the workers with the ``spawn`` method (grpc must not be initialised before a
fork). Each worker runs the ordinary server (``app.serve``) with ``SO_REUSEPORT`` on its own
gRPC and HTTP listeners; the kernel spreads new connections over them, and a connection (so a
Connect stream or a WebSocket connection, with its cache) stays in the process that accepted
it. Workers log to the supervisor's stderr with their index in every line.

SIGTERM or SIGINT to the supervisor is passed to every worker, each stops gracefully (grace
period, post-inference drain), and the supervisor exits once all have: 0 if all exited
cleanly. SIGHUP is passed on (each worker reloads its routes). If a worker dies on its own,
the supervisor stops the others and exits 1, so that a process manager sees the failure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import ctypes.util
import dataclasses
import logging
import multiprocessing
import os
import signal
import socket
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from .config import ServerConfig
from .core.storage.sqlite_schema import prepare_database
from .sockets import bound_socket

log = logging.getLogger("bidi_responses")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# How long workers get to start (import, load the tokenizer, bind) before the supervisor gives up.
_START_TIMEOUT_S = 120.0
_PR_SET_PDEATHSIG = 1


def reserve_port(host: str, port: int) -> socket.socket:
    """A bound, never-listening ``SO_REUSEPORT`` socket that holds ``port`` (0: a free one)."""
    return bound_socket(host, port, reuse_addr=False, reuse_port=True)


def _worker_main(
    build: Callable[[], ServerConfig],
    overrides: dict[str, Any],
    http: bool,
    log_level: str,
    ready: Connection,
) -> None:
    """One worker process: the ordinary server on the shared ports."""
    from .app import serve

    def config() -> ServerConfig:
        return dataclasses.replace(build(), **overrides)

    _stop_with_parent()
    index = overrides["worker_index"]
    logging.basicConfig(
        level=log_level.upper(), format=LOG_FORMAT.replace(": ", f" [worker {index}]: ", 1)
    )

    def on_ready(running: Any) -> None:
        log.info("worker %d (pid %d) serving", index, os.getpid())
        ready.send(os.getpid())
        ready.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config(), http=http, reload=config, on_ready=on_ready))


def _stop_with_parent() -> None:
    """Linux: get SIGTERM if the supervisor dies (even by SIGKILL), so no worker is orphaned."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def run_workers(build: Callable[[], ServerConfig], *, http: bool, log_level: str) -> int:
    """Run ``config.workers`` server processes until SIGTERM/SIGINT; the exit status."""
    config = build()
    logging.basicConfig(
        level=log_level.upper(), format=LOG_FORMAT.replace(": ", " [supervisor]: ", 1)
    )
    holds = [reserve_port(config.host, config.grpc_port)]
    if http:
        holds.append(reserve_port(config.host, config.http_port))
    try:
        ports = [int(s.getsockname()[1]) for s in holds]
        if not config.store.url:  # the embedded SQLite store: schema and WAL mode, once
            prepare_database(config.store_path)
        overrides: dict[str, Any] = {"grpc_port": ports[0], "workers": config.workers}
        if http:
            overrides["http_port"] = ports[1]
        return asyncio.run(_supervise(build, config, overrides, http, log_level, ports))
    finally:
        for sock in holds:
            sock.close()


async def _supervise(
    build: Callable[[], ServerConfig],
    config: ServerConfig,
    overrides: dict[str, Any],
    http: bool,
    log_level: str,
    ports: list[int],
) -> int:
    from .app import guard_public_bind, listening_line

    ctx = multiprocessing.get_context("spawn")
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    ended = asyncio.Event()  # some worker exited
    processes: list[Any] = []

    def signal_all(sig: int) -> None:
        for process in processes:
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, sig)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, signal_all, signal.SIGHUP)

    pipes = []
    for index in range(config.workers):
        receiver, sender = ctx.Pipe(duplex=False)
        process = ctx.Process(
            target=_worker_main,
            args=(build, {**overrides, "worker_index": index}, http, log_level, sender),
            name=f"bidi-responses-worker-{index}",
        )
        process.start()
        sender.close()
        processes.append(process)
        pipes.append(receiver)
        loop.add_reader(process.sentinel, ended.set)

    clean = False
    try:
        if await _wait_ready(pipes, stop, ended):
            _, guard = guard_public_bind(config)
            log.info(listening_line(config, ports[0], ports[1] if http else None, guard))
            waiters = [asyncio.ensure_future(e.wait()) for e in (stop, ended)]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waiters:
                waiter.cancel()
            if not stop.is_set():
                dead = [p for p in processes if not p.is_alive()]
                log.error(
                    "worker(s) %s exited unexpectedly (codes %s); stopping the others",
                    ", ".join(p.name for p in dead),
                    ", ".join(str(p.exitcode) for p in dead),
                )
            else:
                log.info("stopping %d workers", len(processes))
                clean = True
    finally:
        signal_all(signal.SIGTERM)
        limit = config.grace_period_s + 30.0
        for process in processes:
            loop.remove_reader(process.sentinel)
            await loop.run_in_executor(None, process.join, limit)
            if process.is_alive():
                log.error("%s did not stop in %.0f s; killing it", process.name, limit)
                process.kill()
                await loop.run_in_executor(None, process.join, 5.0)
        for pipe in pipes:
            pipe.close()
    codes = [p.exitcode for p in processes]
    if clean and all(code == 0 for code in codes):
        log.info("stopped")
        return 0
    log.error("workers exited with codes %s", codes)
    return 1


async def _wait_ready(pipes: list[Connection], stop: asyncio.Event, ended: asyncio.Event) -> bool:
    """Wait for every worker's "serving" message; False if stopped or a worker died first."""
    loop = asyncio.get_running_loop()
    waiting = set(range(len(pipes)))
    arrived = asyncio.Event()

    def readable(index: int) -> None:
        loop.remove_reader(pipes[index].fileno())
        waiting.discard(index)
        arrived.set()

    for index, pipe in enumerate(pipes):
        loop.add_reader(pipe.fileno(), readable, index)
    try:
        async with asyncio.timeout(_START_TIMEOUT_S):
            while waiting:
                if stop.is_set() or ended.is_set():
                    return False
                arrived.clear()
                waiters = [asyncio.ensure_future(e.wait()) for e in (arrived, stop, ended)]
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                for waiter in waiters:
                    waiter.cancel()
    except TimeoutError:
        log.error("workers did not start within %.0f s", _START_TIMEOUT_S)
        return False
    finally:
        for index in waiting:
            loop.remove_reader(pipes[index].fileno())
    # A worker that died after writing nothing also makes its pipe readable (EOF).
    return not ended.is_set() and all(_sent_pid(pipe) for pipe in pipes)


def _sent_pid(pipe: Connection) -> bool:
    try:
        return isinstance(pipe.recv(), int)
    except (EOFError, OSError):
        return False


def add_workers_flag(parser: argparse.ArgumentParser) -> None:
    """The ``--workers`` option of ``serve``."""
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="server processes sharing the ports, the store and the log (default 1); a "
        "stream stays in the process that accepted its connection",
    )
