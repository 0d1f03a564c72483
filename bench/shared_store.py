"""Benchmark: what a shared PostgreSQL store costs per turn, against embedded SQLite.

One Connect stream, chained small turns (0 ms tool time), the engine made nearly free; the
figure is the client-observed turn time (send to terminal event). Modes, each a fresh server
in this process on the same settings otherwise:

* ``sqlite``: the default; the store write is queued and overlaps the next turn.
* ``postgres-queued``: PostgreSQL with ``ack_after_write = false``: the same overlap (but a
  continuation on another replica may not find the response yet).
* ``postgres-ack``: PostgreSQL as replicas run it (the default for a shared store): the
  terminal event waits for the commit, so any replica can continue at once.

``python -m bidi_responses.bench.shared_store --turns 200 --repeats 3``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from bidi_responses.client import AsyncResponsesClient
from bidi_responses.cluster.postgres import TempPostgres
from bidi_responses.server.app import start_server
from bidi_responses.server.config import ServerConfig

from .jsontypes import JSONObject
from .servers import fast_sim, sim_server_config

SIM = fast_sim(tool_rounds=100_000)
TOOL: JSONObject = {
    "type": "function",
    "name": "exec_command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}


async def turn_times(config: ServerConfig, turns: int) -> list[float]:
    """Client-observed ms of each chained turn after the first."""
    server = await start_server(config, http=False)
    times: list[float] = []
    try:
        async with (
            AsyncResponsesClient(f"127.0.0.1:{server.grpc_port}") as client,
            client.connect() as stream,
        ):
            response = await stream.create(model="sim-model", input="go", tools=[TOOL])
            for i in range(turns):
                started = time.perf_counter()
                response = await stream.create(
                    model="sim-model",
                    previous_response_id=response.id,
                    tools=[TOOL],
                    input=[response.call_output(f"line {i}\n" * 200)],
                )
                times.append((time.perf_counter() - started) * 1000)
    finally:
        await server.stop(grace=0)
    return times


def _config(root: Path, name: str, url: str, ack: bool | None) -> ServerConfig:
    config = sim_server_config(root / name, SIM)
    config.store.url = url
    config.store.ack_after_write = ack
    return config


async def run(turns: int, repeats: int, fsync: bool) -> dict[str, list[float]]:
    """Median turn ms of each mode, per repeat."""
    medians: dict[str, list[float]] = {"sqlite": [], "postgres-queued": [], "postgres-ack": []}
    with TempPostgres(fast=not fsync) as pg, tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for r in range(repeats):
            modes = {
                "sqlite": _config(root, f"s{r}", "", None),
                "postgres-queued": _config(root, f"q{r}", pg.url, False),
                "postgres-ack": _config(root, f"a{r}", pg.url, True),
            }
            for mode, config in modes.items():
                medians[mode].append(statistics.median(await turn_times(config, turns)))
    return medians


def main() -> None:
    """Print a table of medians (min-max over repeats)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--no-fsync", action="store_true", help="PostgreSQL with fsync off (default: on)"
    )
    args = parser.parse_args()
    result = asyncio.run(run(args.turns, args.repeats, fsync=not args.no_fsync))
    print("| mode | turn ms (median of per-run medians, min-max) |")
    print("|---|---|")
    for mode, values in result.items():
        print(f"| {mode} | {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f}) |")


if __name__ == "__main__":
    main()
