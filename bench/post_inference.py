"""Benchmark: post-inference work (ledger and store writes) stays off the critical path.

The figure is the client-observed *gap* between one turn's terminal event and the next turn's
first token, on one Connect stream: the client sends the next turn as soon as it has the
terminal event (0 ms tool time), so the gap is the wire plus the server's pre-inference work
plus the engine's time to first token. If post-inference work sat on the critical path, the
gap would grow with it.

Modes, each on its own server process with the same settings otherwise:

* ``queued``: the server as shipped: each job made durable in the write-ahead journal (one
  group-committed fdatasync) before the terminal event, then written to SQLite by the
  background writer.
* ``unjournaled``: durability off (``--no-journal``): the terminal event goes out before
  anything is durable, as before the journal existed. The difference to ``queued`` is what
  durability costs.
* ``journal-nosync``: the journal without its fdatasync (survives a process crash, not a
  machine crash), to split the cost between the append and the sync.
* ``queued-slow``: the same with every write made ``--store-ms`` slower (a slow disk).
* ``no-writes``: post-inference writes dropped entirely (the floor).
* ``inline-slow``: the contrast, what the design avoids: the slow write done in line, as a
  server does that finishes each request's post-inference work before it reads the
  connection's next request. The terminal event goes out first, then the write holds up the
  next turn.

``queued`` and ``queued-slow`` should match ``no-writes``; ``inline-slow`` shows the cost the
queue hides (about ``--store-ms`` per turn). The engine is set to isolate the API path: no
base time to first token and a prefill rate high enough to be free (flags change both). Run::

    python -m bidi_responses.bench.post_inference --turns 25 --repeats 3

The client runs in this process, each server in its own. Results: a table on stdout and, with
``--out``, a JSON file with every gap, the settings and the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .jsontypes import JSONObject
from .post_inference_server import MODES, Settings, serve
from .stats import percentile

if TYPE_CHECKING:
    from .workload import Workload

__all__ = ["MODES", "Settings", "format_table", "main", "run_benchmark"]

FIRST_TOKEN = ("response.output_text.delta", "response.function_call_arguments.delta")


# -- the client side ----------------------------------------------------------------------------


@dataclass(slots=True)
class ModeResult:
    """Gaps (ms) between a terminal event and the next turn's first token, per repeat."""

    mode: str
    gaps_ms: list[list[float]]
    api_pre_ms: list[float]
    server_written: int | None = None
    # Last output item done -> terminal event (where the journal's sync sits).
    tails_ms: list[float] = field(default_factory=list)
    # Last output item done -> the next turn's first token: the whole critical path between
    # turns (tail + gap), with 0 ms of client tool time.
    turnarounds_ms: list[float] = field(default_factory=list)

    def summary(self) -> JSONObject:
        """Median, p90, p99 and the spread of per-repeat medians."""
        flat = sorted(g for rep in self.gaps_ms for g in rep)
        medians = [statistics.median(rep) for rep in self.gaps_ms if rep]
        return {
            "mode": self.mode,
            "turns": len(flat),
            "gap_p50_ms": percentile(flat, 50),
            "gap_p90_ms": percentile(flat, 90),
            "gap_p99_ms": percentile(flat, 99),
            "gap_mean_ms": statistics.fmean(flat) if flat else float("nan"),
            "repeat_medians_ms": [round(m, 3) for m in medians],
            "server_api_pre_p50_ms": percentile(self.api_pre_ms, 50),
            "tail_p50_ms": percentile(self.tails_ms, 50),
            "tail_p99_ms": percentile(self.tails_ms, 99),
            "turnaround_p50_ms": percentile(self.turnarounds_ms, 50),
            "turnaround_p99_ms": percentile(self.turnarounds_ms, 99),
            "server_jobs_written": self.server_written,
        }


async def _rollout(port: int, workload: Workload, nonce: str, result: ModeResult) -> list[float]:
    """One rollout on a fresh Connect stream; its gaps (tails and turnarounds go to result)."""
    from bidi_responses.client import AsyncResponsesClient

    gaps: list[float] = []
    pre: list[float] = []
    item_done_at: float | None = None
    previous_item_done_at: float | None = None
    async with (
        AsyncResponsesClient(f"127.0.0.1:{port}") as client,
        client.connect() as stream,
    ):
        params: JSONObject = {
            "model": "sim-model",
            "instructions": workload.instructions,
            "tools": workload.tools,
            "input": [workload.user_message(nonce)],
        }
        terminal_at: float | None = None
        for turn in range(workload.spec.tool_turns + 1):
            response: JSONObject | None = None
            async for event in stream.create_events(**params):
                kind = event["type"]
                now = time.perf_counter()
                if kind in FIRST_TOKEN and terminal_at is not None:
                    gaps.append((now - terminal_at) * 1000)
                    terminal_at = None
                    if previous_item_done_at is not None:
                        result.turnarounds_ms.append((now - previous_item_done_at) * 1000)
                elif kind == "response.output_item.done":
                    item_done_at = now
                elif kind == "response.completed":
                    terminal_at = now
                    response = event["response"]
                    if item_done_at is not None:
                        result.tails_ms.append((now - item_done_at) * 1000)
                    previous_item_done_at = item_done_at
                elif kind == "error" or kind in ("response.failed", "response.incomplete"):
                    raise RuntimeError(f"turn {turn}: {event}")
            assert response is not None
            pre.append(float(response["stats"]["api_pre_ms"]))
            calls = [i for i in response["output"] if i["type"] == "function_call"]
            if not calls:
                break
            params = {
                "model": "sim-model",
                "tools": workload.tools,
                "previous_response_id": response["id"],
                "input": [
                    {
                        "type": "function_call_output",
                        "call_id": calls[0]["call_id"],
                        "output": workload.tool_output(turn),
                    }
                ],
            }
    result.api_pre_ms.extend(pre[1:])  # the first turn has no predecessor in the stream
    return gaps


async def _start_server(
    mode: str, settings: Settings, data_root: Path
) -> tuple[asyncio.subprocess.Process, int]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bidi_responses.bench.post_inference",
        "--serve",
        mode,
        "--data-dir",
        str(data_root / mode),
        "--store-ms",
        str(settings.store_ms),
        "--turns",
        str(settings.turns),
        "--tps",
        str(settings.tokens_per_second),
        "--ttft-ms",
        str(settings.ttft_ms),
        "--prefill-tps",
        str(settings.prefill_tokens_per_second),
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    line = (await process.stdout.readline()).decode()
    if not line.startswith("listening "):
        process.kill()
        await process.wait()
        raise RuntimeError(f"server for {mode} did not start: {line!r}")
    return process, int(line.split()[1])


async def _stop_server(process: asyncio.subprocess.Process) -> int | None:
    """SIGTERM, wait; the number of jobs its post queue wrote (None if it did not count)."""
    if process.returncode is not None:
        return None
    assert process.stdout is not None
    process.send_signal(signal.SIGTERM)
    tail = (await process.stdout.read()).decode().split()
    await process.wait()
    if "written" not in tail:
        return None
    written = int(tail[tail.index("written") + 1])
    return written if written >= 0 else None


async def run_benchmark(settings: Settings, modes: tuple[str, ...] = MODES) -> JSONObject:
    """Run every mode; returns the results document.

    All the modes' servers run side by side (idle when not measured) and the repeats go
    round-robin over the modes, in a rotating order, so that a drift of the machine's speed
    during the run falls on every mode alike.
    """
    from .workload import WorkloadSpec, build_workload

    workload = build_workload(
        WorkloadSpec(
            seed=settings.seed,
            tool_turns=settings.turns,
            tool_output_tokens=settings.tool_output_tokens,
        )
    )
    results = {mode: ModeResult(mode, [], []) for mode in modes}
    servers: dict[str, tuple[asyncio.subprocess.Process, int]] = {}
    with tempfile.TemporaryDirectory(prefix="post-bench-") as tmp:
        try:
            for mode in modes:
                servers[mode] = await _start_server(mode, settings, Path(tmp))
            for mode in modes:  # warm caches, imports and the engine
                await _rollout(
                    servers[mode][1], workload, f"warmup-{mode}", ModeResult(mode, [], [])
                )
            for repeat in range(settings.repeats):
                order = modes[repeat % len(modes) :] + modes[: repeat % len(modes)]
                for mode in order:
                    gaps = await _rollout(
                        servers[mode][1], workload, f"{mode}-{repeat}", results[mode]
                    )
                    results[mode].gaps_ms.append(gaps)
            for mode in modes:
                results[mode].server_written = await _stop_server(servers[mode][0])
        finally:
            for process, _ in servers.values():
                if process.returncode is None:
                    process.kill()
                    await process.wait()
    return {
        "benchmark": "post_inference",
        "settings": asdict(settings),
        "summaries": [results[mode].summary() for mode in modes],
        "gaps_ms": {mode: results[mode].gaps_ms for mode in modes},
        "machine": {
            "nproc": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        "command": " ".join(["python -m bidi_responses.bench.post_inference", *sys.argv[1:]]),
    }


def format_table(document: JSONObject) -> str:
    """The summaries as an aligned text table."""
    header = [
        "mode",
        "turns",
        "gap p50 ms",
        "p90",
        "p99",
        "tail p50",
        "p99",
        "turnaround p50",
        "p99",
        "repeat medians",
        "jobs written",
    ]
    rows = [
        [
            s["mode"],
            str(s["turns"]),
            f"{s['gap_p50_ms']:.2f}",
            f"{s['gap_p90_ms']:.2f}",
            f"{s['gap_p99_ms']:.2f}",
            f"{s['tail_p50_ms']:.2f}",
            f"{s['tail_p99_ms']:.2f}",
            f"{s['turnaround_p50_ms']:.2f}",
            f"{s['turnaround_p99_ms']:.2f}",
            " ".join(f"{m:.2f}" for m in s["repeat_medians_ms"]),
            str(s["server_jobs_written"]),
        ]
        for s in document["summaries"]
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: run the benchmark (or, with ``--serve``, be one mode's server)."""
    parser = argparse.ArgumentParser(prog="python -m bidi_responses.bench.post_inference")
    defaults = Settings()
    parser.add_argument("--turns", type=int, default=defaults.turns)
    parser.add_argument("--repeats", type=int, default=defaults.repeats)
    parser.add_argument("--store-ms", type=float, default=defaults.store_ms)
    parser.add_argument("--tool-output-tokens", type=int, default=defaults.tool_output_tokens)
    parser.add_argument("--tps", type=float, default=defaults.tokens_per_second)
    parser.add_argument("--ttft-ms", type=float, default=defaults.ttft_ms)
    parser.add_argument("--prefill-tps", type=float, default=defaults.prefill_tokens_per_second)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    settings = Settings(
        turns=args.turns,
        repeats=args.repeats,
        store_ms=args.store_ms,
        tool_output_tokens=args.tool_output_tokens,
        tokens_per_second=args.tps,
        ttft_ms=args.ttft_ms,
        prefill_tokens_per_second=args.prefill_tps,
    )
    if args.serve:
        asyncio.run(serve(args.serve, args.data_dir, args.store_ms, settings))
        return 0
    modes = tuple(m for m in args.modes.split(",") if m)
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")
    document = asyncio.run(run_benchmark(settings, modes))
    print(format_table(document))
    if args.out:
        Path(args.out).write_text(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
