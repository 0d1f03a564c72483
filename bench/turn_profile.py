"""``make turn-profile``: where a stateful turn's server CPU goes, on the peers workload.

The server runs as ``make peers`` runs it (its own process, the instant fake model in another);
one agent loop after another goes through one mode (WebSocket mode, Connect, HTTP with
``previous_response_id``). Per mode it reports:

- the server's CPU per tool turn (the median), and its CPU per turn over every turn of the
  loops (the mean: first turns and connection set-up included), split by thread: the event
  loop's thread, and the worker threads (the journal's group commit, the SQLite writer,
  offloaded work), read from ``/proc/<pid>/task`` around the loops (clock ticks, so many
  turns are needed);
- with ``--py-spy`` (``make turn-profile`` installs it in the peers' venv), the server's
  Python time by phase: py-spy samples whichever thread holds the GIL (the event loop's, but
  for the worker threads' Python), and each sample is counted in the innermost phase its
  stack passes through (``PHASES``). Work done with the GIL released (tokenizing, system
  calls, fsync) is in the thread figures, not in the phases.

Run: ``python -m bidi_responses.bench.turn_profile --modes websocket,connect --loops 10``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

import aiohttp

from . import peers
from .run.server import ServerProcess
from .workload import Workload

__all__ = ["PHASES", "ModeProfile", "main", "phase_of", "phase_shares", "run"]

#: Phases of a turn, each named by what its stack frames hold (file or function). A sample
#: counts in the innermost phase of its stack; one in none of them is the event loop's own.
PHASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "finish: usage, journal, store",
        ("terminal.py", "journal.py", "postinference.py", "sqlite_", "storage/store.py"),
    ),
    ("pre-inference stages", ("pipeline/injection.py", "pipeline/secrets.py", "ports/stage.py")),
    ("render and tokenize", ("rendering/", "runs/prompt.py")),
    (
        "engine request",
        ("ClientSession._request", "prompt_json.py", "client_reqrep.py", "http_writer.py"),
    ),
    ("engine stream", ("completion_stream.py", "completion_parser.py", "client_proto.py")),
    (
        "output items to events",
        ("runs/streaming.py", "output_items.py", "lanes/", "runs/runner.py", "handoff.py"),
    ),
    ("client write", ("StreamDriver._write", "websockets/", "framing.py", "grpc/", "cygrpc")),
    ("client read and parse", ("StreamDriver._read", "http/websocket.py", "core/api/")),
    (
        "HTTP server: request, routing, SSE",
        ("uvicorn/protocols/http", "h11/", "starlette/", "transports/http/"),
    ),
)
LOOP_PHASE = "event loop and the rest"


class ModeProfile(TypedDict):
    """One mode's figures: CPU per turn, by thread, and the phases of its Python time."""

    mode: str
    #: The median tool turn (precise clock).
    tool_turn_cpu_ms: float
    #: The mean over every turn of the loops (precise clock), and its split by thread (ticks).
    turn_cpu_ms_mean: float
    event_loop_thread_ms: float
    worker_threads_ms: float
    phases: dict[str, float]


def phase_of(stack: Sequence[str]) -> str:
    """The phase of one sampled stack (outermost frame first)."""
    for frame in reversed(stack):
        for name, marks in PHASES:
            if any(mark in frame for mark in marks):
                return name
    return LOOP_PHASE


def phase_shares(raw: str) -> dict[str, float]:
    """Each phase's share of the samples of a py-spy ``--format raw`` profile (a line per
    distinct stack: frames joined by ``;``, then the count)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.strip().rpartition(" ")
        if stack and count.isdigit():
            counts[phase_of(stack.split(";"))] += int(count)
    total = sum(counts.values())
    return {name: n / total for name, n in counts.most_common()} if total else {}


def _thread_ticks(pid: int) -> dict[int, int]:
    """CPU clock ticks (user + system) of each thread of ``pid``."""
    ticks: dict[int, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        ticks[int(tid)] = int(fields[11]) + int(fields[12])
    return ticks


async def _profile_mode(
    mode: str,
    server: ServerProcess,
    workload: Workload,
    loops: int,
    py_spy: str | None,
    out: Path,
    turns: int,
) -> ModeProfile:
    address = server.address
    assert address is not None and server.proc is not None
    pid = server.proc.pid
    url = f"http://127.0.0.1:{address.http_port}"

    async def model_ms() -> float:
        return 0.0  # CPU only: the model's time is not subtracted here

    async with aiohttp.ClientSession() as session:
        grpc_target = f"127.0.0.1:{address.grpc_port}"

        async def one_loop(nonce: str) -> list[float]:
            """Every turn's server CPU (ms)."""
            async with peers.channel(session, url, grpc_target, mode) as send:
                figures = await peers._loop(
                    send, mode, workload, turns, nonce, model_ms, server.cpu_seconds
                )
            return [t.cpu_ms for t in figures]

        await one_loop(f"{mode} warm-up")
        spy: asyncio.subprocess.Process | None = None
        raw = out / f"turn-profile-{mode}.raw"
        if py_spy:
            command = [py_spy, "record", "--pid", str(pid), "--gil", "--nonblocking"]
            command += ["--rate", "1000", "--format", "raw", "-o", str(raw)]
            spy = await asyncio.create_subprocess_exec(
                *command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
        before = _thread_ticks(pid)
        every_turn: list[float] = []
        tool_turns: list[float] = []
        for n in range(loops):
            figures = await one_loop(f"{mode} {n}")
            every_turn += figures
            tool_turns += figures[1:]  # the first turn answers the user, not a tool
        after = _thread_ticks(pid)
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        async with asyncio.timeout(60):
            _, err = await spy.communicate()
        if not raw.exists():
            raise RuntimeError(f"py-spy wrote no profile: {err.decode(errors='replace')}")
    hz = os.sysconf("SC_CLK_TCK")
    per_turn_ms = 1000 / hz / (loops * turns)
    main_ms = (after.get(pid, 0) - before.get(pid, 0)) * per_turn_ms
    workers_ms = sum(t - before.get(tid, 0) for tid, t in after.items() if tid != pid)
    return {
        "mode": mode,
        "tool_turn_cpu_ms": statistics.median(tool_turns),
        "turn_cpu_ms_mean": statistics.fmean(every_turn),
        "event_loop_thread_ms": main_ms,
        "worker_threads_ms": workers_ms * per_turn_ms,
        "phases": phase_shares(raw.read_text()) if spy is not None else {},
    }


async def run(
    modes: Sequence[str], loops: int, py_spy: str | None, out: Path, turns: int = 20
) -> list[ModeProfile]:
    """Profile each mode against one server (module docstring)."""
    workload = peers.peers_workload(turns)
    with tempfile.TemporaryDirectory(prefix="turn-profile-") as tmp:
        work = Path(tmp)
        model = peers.model_process(work, turns)
        server: ServerProcess | None = None
        try:
            server = ServerProcess(peers.server_settings(model.wait_url(), turns), work, "bidi")
            server.start()
            return [
                await _profile_mode(m, server, workload, loops, py_spy, out, turns) for m in modes
            ]
        finally:
            if server is not None:
                server.stop()
            model.stop()


def format_report(results: Sequence[ModeProfile]) -> str:
    lines: list[str] = []
    for r in results:
        lines.append(
            f"{r['mode']}: {r['tool_turn_cpu_ms']:.2f} ms of server CPU a tool turn (median); "
            f"{r['turn_cpu_ms_mean']:.2f} ms a turn over every turn (mean): event loop thread "
            f"{r['event_loop_thread_ms']:.2f} ms, worker threads {r['worker_threads_ms']:.2f} ms"
        )
        lines += [f"  {share * 100:5.1f}%  {name}" for name, share in r["phases"].items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--modes", default="websocket,connect,http_previous")
    parser.add_argument("--loops", type=int, default=10)
    parser.add_argument("--py-spy", help="the py-spy command, to split the loop's time by phase")
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(peers.MODES["bidi"])
    if unknown:
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")
    args.out.mkdir(parents=True, exist_ok=True)
    results = asyncio.run(run(modes, args.loops, args.py_spy, args.out))
    print(format_report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
