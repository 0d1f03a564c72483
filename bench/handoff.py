"""Benchmark: a resumed stream restored from the shared tier vs a full re-render, ~100k tokens.

Two replicas share one PostgreSQL (a throwaway server from ``bidi_responses.cluster``). On
replica A a conversation grows to ``--history-tokens`` (the history sweep's realistic tool
outputs), then takes a few small turns. A is drained (SIGTERM's code path: ``stop``), which
leaves the stream's state in PostgreSQL. On replica B the next small turn is sent three ways:

* ``cached``: for reference, the same small turn on A's stream before the drain;
* ``restored``: on a new stream at B, which takes A's state from PostgreSQL;
* ``re-rendered``: the same turn again at B, now without a state: B rebuilds the history from
  the stored chain, validating, classifying and rendering all of it (what every resumed turn
  costs without handoff, and what the hosted API's reconnect costs).

Reported per mode: the server's pre-inference time (``response.stats.api_pre_ms``, which for
``restored`` includes fetching and decoding the state), tokens rendered, items validated, and
the client-observed turn time; plus the state's size and the cost of each handoff step alone
(encode, save, take, decode). Medians of ``--repeats`` runs, each on a fresh replica A::

    python -m bidi_responses.bench.handoff --history-tokens 100000 --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from collections.abc import Awaitable
from pathlib import Path

import asyncpg
from bidi_responses.client import AsyncResponsesClient, Response
from bidi_responses.cluster.postgres import TempPostgres
from bidi_responses.server.app import RunningServer, start_server
from bidi_responses.server.config import ServerConfig
from bidi_responses.server.core.storage.handoff import decode_state, encode_state
from bidi_responses.server.core.storage.pg_store import PostgresStore

from .jsontypes import JSONObject, JSONValue
from .servers import fast_sim, sim_server_config
from .workload import build_history_workload

# The engine is made nearly free, so what differs between modes is the API's own work.
SIM = fast_sim(tool_rounds=1000, answer_tokens=40)


def _config(root: Path, name: str, url: str) -> ServerConfig:
    config = sim_server_config(root / name, SIM)
    config.store.url = url
    return config


async def _timed(coro: Awaitable[Response]) -> tuple[Response, float]:
    started = time.perf_counter()
    response: Response = await coro
    return response, (time.perf_counter() - started) * 1000


def _row(response: Response, turn_ms: float) -> JSONObject:
    stats = response.stats
    return {
        "api_pre_ms": stats["api_pre_ms"],
        "tokens_rendered": stats["tokens_rendered"],
        "tokens_reused": stats["tokens_reused"],
        "items_validated": stats["items_validated"],
        "turn_ms": round(turn_ms, 3),
        "input_tokens": response.usage.input_tokens if response.usage else 0,
    }


async def one_run(
    url: str, root: Path, b: RunningServer, history_tokens: int, run: int
) -> JSONObject:
    """One conversation on a fresh replica A, handed to B."""
    work = build_history_workload(seed=run, max_tokens=history_tokens + 8000)
    a = await start_server(_config(root, f"a{run}", url), http=False)
    params: JSONObject = {
        "model": "sim-model",
        "instructions": work.instructions,
        "tools": work.tools,
    }

    def small(previous: Response, index: int) -> JSONObject:
        call = previous.function_calls[0]
        output = work.small_outputs[index % len(work.small_outputs)]
        return {
            **params,
            "previous_response_id": previous.id,
            "input": [
                {"type": "function_call_output", "call_id": call["call_id"], "output": output}
            ],
        }

    try:
        async with AsyncResponsesClient(f"127.0.0.1:{a.grpc_port}") as on_a:
            stream = on_a.open_stream()
            last = await stream.create(**params, input=work.history(history_tokens))
            for i in range(2):
                last = await stream.create(**small(last, i))
            last, cached_ms = await _timed(stream.create(**small(last, 2)))
            cached = _row(last, cached_ms)
            await a.stop(grace=10)  # the drain leaves the stream's state in PostgreSQL
            await stream.close()
    finally:
        await a.stop(grace=0)

    conn = await asyncpg.connect(url)
    try:
        blob: bytes = await conn.fetchval(
            "SELECT state FROM conversation_states WHERE response_id = $1", last.id
        )
    finally:
        await conn.close()
    assert blob is not None, "the drain left no state"

    async with AsyncResponsesClient(f"127.0.0.1:{b.grpc_port}") as on_b:
        async with on_b.connect() as stream:
            restored_response, restored_ms = await _timed(stream.create(**small(last, 3)))
        async with on_b.connect() as stream:
            rebuilt_response, rebuilt_ms = await _timed(stream.create(**small(last, 3)))
    restored = _row(restored_response, restored_ms)
    rebuilt = _row(rebuilt_response, rebuilt_ms)
    assert restored["input_tokens"] == rebuilt["input_tokens"], "modes saw different prompts"

    # Each handoff step alone, on this run's state.
    started = time.perf_counter()
    state = decode_state(blob)
    decode_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    encoded = encode_state(state)
    encode_ms = (time.perf_counter() - started) * 1000
    store = PostgresStore(url, pool_size=1)
    await store.open()
    try:
        started = time.perf_counter()
        await store.save_states([(f"bench_{run}", encoded)], ttl_s=3600)
        save_ms = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        taken = await store.take_state(f"bench_{run}")
        take_ms = (time.perf_counter() - started) * 1000
    finally:
        await store.aclose()
    assert taken == encoded
    return {
        "history_tokens": rebuilt["input_tokens"],
        "state_bytes": len(blob),
        "state_tokens": len(state.tokens),
        "encode_ms": round(encode_ms, 3),
        "save_ms": round(save_ms, 3),
        "take_ms": round(take_ms, 3),
        "decode_ms": round(decode_ms, 3),
        "cached": cached,
        "restored": restored,
        "re-rendered": rebuilt,
    }


async def run(history_tokens: int, repeats: int) -> JSONObject:
    """Every run, on one PostgreSQL and one replica B."""
    with TempPostgres(fast=False) as pg:
        root = pg.root.parent / f"{pg.root.name}-servers"
        b = await start_server(_config(root, "b", pg.url), http=False)
        try:
            runs = [await one_run(pg.url, root, b, history_tokens, i) for i in range(repeats)]
        finally:
            await b.stop(grace=0)
    return {
        "machine": platform.platform(),
        "python": platform.python_version(),
        "history_tokens_target": history_tokens,
        "runs": runs,
    }


def _values(runs: list[JSONObject], *path: str) -> list[float]:
    """The figure at ``path`` (nested keys) in each run."""
    values = []
    for r in runs:
        value: JSONValue = r
        for key in path:
            value = value[key]
        values.append(float(value))
    return values


def _median(runs: list[JSONObject], *path: str) -> float:
    return statistics.median(_values(runs, *path))


def _spread(runs: list[JSONObject], *path: str) -> str:
    values = _values(runs, *path)
    return f"{min(values):.2f}-{max(values):.2f}"


def report(result: JSONObject) -> str:
    """A markdown table of medians (min-max)."""
    runs = result["runs"]
    lines = [
        f"history: {int(_median(runs, 'history_tokens'))} tokens; "
        f"state {int(_median(runs, 'state_bytes')) / 1e6:.2f} MB; {len(runs)} runs",
        "",
        "| mode | API pre-inference ms | tokens rendered | items validated | turn ms |",
        "|---|---|---|---|---|",
    ]
    for mode in ("cached", "restored", "re-rendered"):
        lines.append(
            f"| {mode} | {_median(runs, mode, 'api_pre_ms'):.2f} "
            f"({_spread(runs, mode, 'api_pre_ms')}) "
            f"| {int(_median(runs, mode, 'tokens_rendered'))} "
            f"| {int(_median(runs, mode, 'items_validated'))} "
            f"| {_median(runs, mode, 'turn_ms'):.2f} ({_spread(runs, mode, 'turn_ms')}) |"
        )
    lines += [
        "",
        "| handoff step | ms (median, min-max) |",
        "|---|---|",
    ]
    for step in ("encode_ms", "save_ms", "take_ms", "decode_ms"):
        lines.append(f"| {step[:-3]} | {_median(runs, step):.2f} ({_spread(runs, step)}) |")
    return "\n".join(lines)


def main() -> None:
    """Run and print the table (and the JSON with ``--out``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history-tokens", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="write every run as JSON here")
    args = parser.parse_args()
    result = asyncio.run(run(args.history_tokens, args.repeats))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    print(report(result))


if __name__ == "__main__":
    main()
