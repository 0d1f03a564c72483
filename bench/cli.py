"""``bidi-responses compare``: every mode, the same rollouts, measured side by side.

The default configuration is ``make compare``: the headline rollout (1,000 tok/s, 25 tool turns
of 4k-token outputs, all eight modes, 3 repeats), the 4,000 tok/s keep-up test with and without
delta merging, the history-length sweep, the tokens/s sweep, the concurrency sweep and the
steering sweep (steer sent -> acknowledgement and -> the successor's first token, on the two
streams), sized to finish in under ten minutes on two cores. Every server runs with the default
delta merging window (``streaming.delta_window_ms``, 2 ms) except where a table says otherwise.
The simulated engine runs in its own process (``bench.sim_backend``) behind the server's
production ``completions`` route, its CPU reported apart from the server's; ``--engine inproc``
runs it inside the server, as earlier reports did. ``--smoke`` is a tiny version for the test
suite.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .compare_args import SWEEPS, config_from_args

if TYPE_CHECKING:
    from .run import CompareConfig

__all__ = ["add_compare", "run"]


def add_compare(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``compare`` subcommand (sets ``handler``)."""
    p = sub.add_parser(
        "compare",
        help="benchmark gRPC bidi vs WebSocket vs HTTP on the same rollouts",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default="bench-out", help="output directory (default bench-out)")
    p.add_argument(
        "--modes",
        default="all",
        help="modes by number or key, comma-separated (default all): 1 http_new, "
        "2 http_keepalive, 3 http_store, 4 ws_cache, 5 ws_append, "
        "6 grpc_create, 7 grpc_connect, 8 grpc_append, 9 grpc_single (batching and the "
        "client's window off: a stock client), 10 grpc_slim (slim snapshots), 11 ws_batched "
        "(non-standard batched frames), 12 grpc_tokens (the server's 2 ms delta window)",
    )
    p.add_argument(
        "--sweeps",
        default=",".join(SWEEPS),
        help=f"which parts to run (default {','.join(SWEEPS)})",
    )
    p.add_argument("--repeats", type=int, default=3, help="repeats per cell (default 3)")
    p.add_argument("--seed", type=int, default=0, help="workload and engine seed")
    p.add_argument("--turns", type=int, default=25, help="headline tool turns (default 25)")
    p.add_argument(
        "--output-tokens",
        type=int,
        default=4000,
        help="headline tool-output size in tokens (default 4000)",
    )
    p.add_argument(
        "--tool-ms", type=float, default=0.0, help="client tool execution time per call (default 0)"
    )
    p.add_argument("--tps", type=float, default=1000.0, help="headline decode rate (1000)")
    p.add_argument(
        "--trace",
        default=None,
        help="replay a recorded trace (script-engine JSONL) instead of the sim model",
    )
    p.add_argument("--tps-values", default="65,1000,4000", help="tokens/s sweep points")
    p.add_argument("--tps-turns", type=int, default=10, help="tool turns in the tokens/s sweep")
    p.add_argument("--tps-modes", default="1-8", help="modes of the tokens/s sweep (default 1-8)")
    p.add_argument(
        "--slow-modes", default="1,4,7", help="modes at slow points (<= 100 tok/s; default 1,4,7)"
    )
    p.add_argument("--slow-repeats", type=int, default=1, help="repeats at slow points (1)")
    p.add_argument(
        "--history-sizes", default="1000,25000,100000,200000", help="history sweep sizes in tokens"
    )
    p.add_argument(
        "--history-turns",
        type=int,
        default=6,
        help="measured small turns per history size (default 6)",
    )
    p.add_argument(
        "--history-modes",
        default="1-9",
        help="modes of the history sweep (default 1-9)",
    )
    p.add_argument(
        "--history-repeats",
        type=int,
        default=None,
        help="repeats in the history sweep (default --repeats)",
    )
    p.add_argument(
        "--network-rtts",
        default="0,2,20,80",
        help="network sweep: round-trip times in ms between clients and server (0,2,20,80)",
    )
    p.add_argument(
        "--network-mbits",
        default="0,100,10",
        help="network sweep: link rates in Mbit/s each way, 0 unlimited (default 0,100,10)",
    )
    p.add_argument("--network-turns", type=int, default=25, help="network sweep: tool turns (25)")
    p.add_argument(
        "--network-output-tokens",
        type=int,
        default=4000,
        help="network sweep: tool-output size in tokens (4000)",
    )
    p.add_argument(
        "--network-repeats", type=int, default=3, help="network sweep: repeats per cell (3)"
    )
    p.add_argument(
        "--network-modes",
        default="1,2,4,7",
        help="network sweep: modes (default 1,2,4,7: HTTP new connection and keep-alive, "
        "WebSocket mode, Connect)",
    )
    p.add_argument("--network-no-tls", action="store_true", help="network sweep: plain TCP, no TLS")
    p.add_argument(
        "--network-multiplex",
        default="20:0,80:10",
        help="network sweep: links RTT_MS:MBIT measured with --network-agents agents in one "
        "client process, modes 4 and 7 (default 20:0,80:10; empty: none)",
    )
    p.add_argument(
        "--network-lanes",
        default="20:0,80:10",
        help="network sweep: links RTT_MS:MBIT measured with --network-agents agents on one "
        "connection, a lane each, modes 4 and 7 (default 20:0,80:10; empty: none)",
    )
    p.add_argument(
        "--network-large",
        default="80:100",
        help="network sweep: links RTT_MS:MBIT measured with 5 tool turns of 50k-token "
        "outputs, modes 4 and 7 (default 80:100; empty: none)",
    )
    p.add_argument(
        "--network-agents", type=int, default=16, help="network sweep: agents sharing a link (16)"
    )
    p.add_argument(
        "--network-mesh",
        default="20:0,80:10",
        help="network sweep: links RTT_MS:MBIT measured again with Envoy between the link and "
        "the server, for modes 1, 4 and 7 (default 20:0,80:10; empty: none)",
    )
    p.add_argument(
        "--network-llama",
        default="0:0,20:0",
        help="network sweep: links RTT_MS:MBIT measured with llama.cpp (the tiny generated "
        "model, its own process) as the engine, every network mode (default 0:0,20:0; empty: "
        "none)",
    )
    p.add_argument("--agents", default="1,4,16,64", help="concurrency sweep points")
    p.add_argument(
        "--concurrency-modes",
        default="1,2,4,7",
        help="modes of the concurrency sweep (default 1,2,4,7)",
    )
    p.add_argument(
        "--concurrency-turns",
        type=int,
        default=5,
        help="tool turns per agent in the concurrency sweep (default 5)",
    )
    p.add_argument(
        "--concurrency-repeats",
        type=int,
        default=2,
        help="repeats in the concurrency sweep (default 2)",
    )
    p.add_argument(
        "--concurrency-workers",
        default="1,2",
        help="run the concurrency sweep with each of these server process counts "
        "(serve --workers; default 1,2)",
    )
    p.add_argument(
        "--workers-modes",
        default="4,7",
        help="modes of the sweep at more than one worker (default 4,7)",
    )
    p.add_argument(
        "--concurrency-window",
        type=float,
        default=0.0,
        help="also run the concurrency sweep with this delta window (ms) instead of the "
        "server's default (2) for --concurrency-window-modes (default 0: merge only deltas "
        "already waiting; skipped if it equals the default)",
    )
    p.add_argument(
        "--concurrency-window-modes",
        default="",
        help="modes of that extra concurrency sweep (default empty: skip it)",
    )
    p.add_argument(
        "--keepup-windows",
        default="off,0,2",
        help="delta merging policies of the keep-up test: off, or a window in ms "
        "(default off,0,2; 2 is the server's default)",
    )
    p.add_argument("--keepup-modes", default="7,9,4", help="modes of the keep-up test")
    p.add_argument(
        "--steer-rounds", type=int, default=30, help="steered responses per mode and repeat (30)"
    )
    p.add_argument(
        "--steer-modes",
        default="4,7",
        help="stream modes of the steering sweep (default 4,7: WebSocket mode, Connect)",
    )
    p.add_argument(
        "--store-all",
        action="store_true",
        help="store=true in every mode (default: only mode 3, which needs it)",
    )
    p.add_argument(
        "--malloc-tuned",
        action="store_true",
        help="set GLIBC_TUNABLES (trim and mmap thresholds) in server and clients",
    )
    p.add_argument(
        "--backend-url",
        default=None,
        help="run the rollouts on a real OpenAI-compatible completions backend (vLLM, SGLang, "
        "llama.cpp) at this base URL, e.g. http://gpu-host:8000/v1, instead of the sim engine; "
        "only the headline sweep applies",
    )
    p.add_argument(
        "--engine",
        default="process",
        choices=("process", "inproc"),
        help="where the simulated engine runs: process (default: its own process, "
        "bench.sim_backend, served through the server's completions route, its CPU reported "
        "apart) or inproc (inside the server, whose CPU then includes the engine's pacing; "
        "the configuration of reports before the engine had its own process)",
    )
    p.add_argument("--backend-model", default="", help="the backend's model name")
    p.add_argument(
        "--backend-format",
        default="generic",
        choices=("generic", "harmony"),
        help="the model's prompt format (harmony for gpt-oss; default generic)",
    )
    p.add_argument(
        "--backend-api-key-env",
        default="",
        help="environment variable holding the backend's API key (read by the server)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument(
        "--doc",
        type=Path,
        default=None,
        help="also write the whole results document here (make compare: docs/results.md), "
        "its plots in the folder named after it (docs/results/)",
    )
    p.add_argument(
        "--from-results",
        type=Path,
        default=None,
        help="measure nothing: rebuild the report, plots and document from a results.json "
        "an earlier run wrote",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny configuration of everything (used by the test suite)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """The ``compare`` handler: run, print the tables, write the files."""
    from .report import (
        build_report,
        machine_info,
        write_document,
        write_outputs,
    )
    from .run import MALLOC_TUNED, WorkerError, run_compare

    try:
        config = config_from_args(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = config.out_dir
    if args.from_results is not None:
        return _rerender(args, config)
    print(
        f"bidi-responses compare: modes {', '.join(m.key for m in config.modes)}; "
        f"sweeps {', '.join(config.sweeps)}; output in {out}/",
        flush=True,
    )
    started = time.time()
    load_start = _load()
    # Read before the run: the commit measured is the one checked out when it started.
    machine = machine_info()
    t0 = time.perf_counter()
    try:
        cells = run_compare(config)
    except (WorkerError, RuntimeError) as error:
        # A failed turn invalidates the comparison: say what failed instead of half a table.
        print(f"\nerror: the comparison did not complete:\n{error}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - t0
    meta = {
        "command": config.command,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)),
        "duration_s": round(elapsed, 1),
        "machine": machine,
        # The machine may be shared: its load around the run says how quiet it was.
        "load_average": {"start": load_start, "end": _load()},
        # Where the simulated engine ran: "process" (its own, through the completions route)
        # or "inproc" (inside the server, whose CPU then includes it).
        "engine": (
            "script" if config.trace else "backend" if config.backend_url else config.engine
        ),
        "allocator": (
            f"glibc malloc, GLIBC_TUNABLES={MALLOC_TUNED}"
            if config.malloc_tuned
            else "default glibc malloc (no GLIBC_TUNABLES)"
        ),
        "clients": {
            "http": "aiohttp (keep-alive pool; mode 1: force_close connector)",
            "ws": "websockets (asyncio client, compression off)",
            "grpc": "bidi_responses.client.AsyncResponsesClient (grpc.aio)",
        },
    }
    report = build_report(cells, config, meta)
    print()
    print(report.text())
    paths = write_outputs(report, out, plots=not args.no_plots)
    paths.update(write_document(report, out, args.doc))
    print()
    print(f"finished in {elapsed:.0f} s; wrote:")
    for path in paths.values():
        print(f"  {path}")
    return 0


def _load() -> str:
    """The 1, 5 and 15 minute load averages, as text."""
    import os

    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def _rerender(args: argparse.Namespace, config: CompareConfig) -> int:
    """``--from-results``: the report, plots and document of an earlier run, measured again
    by nothing (the document's prose or tables changed, the figures did not)."""
    import json

    from .report import build_report, write_document, write_outputs
    from .run import CellResult

    data = json.loads(args.from_results.read_text(encoding="utf-8"))
    cells = [CellResult(**cell) for cell in data["cells"]]
    report = build_report(cells, config, data["meta"])
    paths = write_outputs(report, config.out_dir, plots=not args.no_plots)
    paths.update(write_document(report, config.out_dir, args.doc))
    print("wrote:")
    for path in paths.values():
        print(f"  {path}")
    return 0
