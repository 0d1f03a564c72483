"""Benchmark: what an HTTP ``previous_response_id`` turn costs the server, turn by turn.

One agent loop of ``--turns`` turns over ``POST /v1/responses`` (``store: true``, the SDK's
default): a user message, then one tool output per turn, each request naming the previous
response. The server runs in this process on the instant simulated engine, so what a turn
costs is the API's own work: ``stats.api_pre_ms + stats.api_post_ms`` (the server's time
before the engine's first token and after its last) is reported per turn, with the client's
wall time beside it. A turn whose cost grows with the conversation reprocesses its history.

The loop is repeated ``--repeats`` times, each with its own conversation (a nonce in the
first message); figures are the median and the 10th-90th percentiles over the repeats, from
one run. Run::

    python -m bidi_responses.bench.http_continuation --turns 20 --repeats 15
    python -m bidi_responses.bench.http_continuation --recent-max-responses 0   # no state kept
    python -m bidi_responses.bench.http_continuation --transport websocket      # the same loop

The workload is the issue's: tool outputs of about 800 tokens (3 KB), the benchmark's 8 tools,
about 300 tokens (1.3 KB) of instructions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
from websockets.asyncio.client import ClientConnection, connect

from .jsontypes import JSONObject
from .servers import fast_sim, sim_server_config
from .stats import median, percentile
from .workload import Workload, WorkloadSpec, build_workload

Send = Callable[[JSONObject], Awaitable[JSONObject]]


def _http(http: httpx.AsyncClient) -> Send:
    async def send(body: JSONObject) -> JSONObject:
        reply = await http.post("/v1/responses", json=body)
        reply.raise_for_status()
        response: JSONObject = reply.json()
        return response

    return send


def websocket_turns(ws: ClientConnection) -> Send:
    """One ``response.create`` per call on a WebSocket-mode connection: its completed
    response (an error event raises)."""

    async def send(body: JSONObject) -> JSONObject:
        await ws.send(json.dumps({"type": "response.create", **body}))
        while True:
            event = json.loads(await ws.recv())
            if event["type"] == "error":
                raise RuntimeError(f"error event: {event}")
            if event["type"] == "response.completed":
                response: JSONObject = event["response"]
                return response

    return send


async def _loop(
    send: Send, turns: int, nonce: str, workload: Workload
) -> list[tuple[float, float]]:
    """One agent loop; per turn (server ms, client wall ms)."""
    common: JSONObject = {
        "model": "sim-model",
        "instructions": workload.instructions,
        "tools": list(workload.tools),
        "store": True,
    }
    figures: list[tuple[float, float]] = []
    body: JSONObject = {**common, "input": [workload.user_message(nonce)]}
    for turn in range(turns):
        started = time.perf_counter()
        response = await send(body)
        wall_ms = (time.perf_counter() - started) * 1000
        stats = response["stats"]
        assert isinstance(stats, dict)
        figures.append((stats["api_pre_ms"] + stats["api_post_ms"], wall_ms))
        output = response["output"]
        assert isinstance(output, list)
        calls = [i for i in output if isinstance(i, dict) and i["type"] == "function_call"]
        if turn + 1 < turns and not calls:
            raise RuntimeError(f"turn {turn + 1} called no tool; the engine must call {turns}")
        outputs: list[JSONObject] = [
            {"type": "function_call_output", "call_id": c["call_id"], "output": out}
            for c, out in zip(calls, [workload.tool_output(turn)] * len(calls), strict=True)
        ]
        body = {**common, "previous_response_id": response["id"], "input": outputs}
    return figures


async def run_benchmark(
    turns: int,
    repeats: int,
    data_dir: Path,
    recent: int | None = None,
    transport: str = "http",
) -> JSONObject:
    """Run the loops against an in-process server; per-turn figures over the repeats.
    ``recent`` sets ``cache.recent_max_responses`` (0: every turn rebuilt from the store);
    ``transport`` "websocket" runs each loop on one WebSocket-mode connection instead."""
    from bidi_responses.server.app import start_server

    config = sim_server_config(data_dir, fast_sim(tool_rounds=turns - 1, answer_tokens=50))
    if recent is not None:
        config.cache.recent_max_responses = recent
    spec = WorkloadSpec(
        tool_turns=turns, tool_output_tokens=800, user_tokens=300, instructions_tokens=300
    )
    workload = build_workload(spec)
    running = await start_server(config, http=True)
    loops: list[list[tuple[float, float]]] = []
    try:
        base = f"127.0.0.1:{running.http_port}"
        async with httpx.AsyncClient(base_url=f"http://{base}", timeout=60) as http:
            for r in range(repeats + 1):  # the first warms imports, tokenizer and route
                if transport == "websocket":
                    async with connect(f"ws://{base}/v1/responses", max_size=None) as ws:
                        figures = await _loop(websocket_turns(ws), turns, f"run {r}", workload)
                else:
                    figures = await _loop(_http(http), turns, f"run {r}", workload)
                if r:
                    loops.append(figures)
    finally:
        await running.stop(grace=0)
    per_turn: list[JSONObject] = []
    for turn in range(turns):
        server = [loop[turn][0] for loop in loops]
        wall = [loop[turn][1] for loop in loops]
        per_turn.append(
            {
                "turn": turn + 1,
                "server_ms": {
                    "median": median(server),
                    "p10": percentile(server, 10),
                    "p90": percentile(server, 90),
                },
                "wall_ms": {
                    "median": median(wall),
                    "p10": percentile(wall, 10),
                    "p90": percentile(wall, 90),
                },
            }
        )
    return {"transport": transport, "turns": turns, "repeats": repeats, "per_turn": per_turn}


def format_table(result: JSONObject) -> str:
    """Per turn: server and wall time, median [p10-p90]."""
    lines = ["turn  server ms (median [p10-p90])   wall ms (median [p10-p90])"]
    rows = result["per_turn"]
    assert isinstance(rows, list)
    for row in rows:
        assert isinstance(row, dict)
        s, w = row["server_ms"], row["wall_ms"]
        assert isinstance(s, dict) and isinstance(w, dict)
        lines.append(
            f"{row['turn']:>4}  {s['median']:7.2f} [{s['p10']:6.2f}-{s['p90']:6.2f}]"
            f"          {w['median']:7.2f} [{w['p10']:6.2f}-{w['p90']:6.2f}]"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--recent-max-responses",
        type=int,
        help="the server's cache.recent_max_responses (0: every turn rebuilt from the store)",
    )
    parser.add_argument("--transport", choices=("http", "websocket"), default="http")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as data_dir:
        result = asyncio.run(
            run_benchmark(
                args.turns, args.repeats, Path(data_dir), args.recent_max_responses, args.transport
            )
        )
    print(format_table(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
