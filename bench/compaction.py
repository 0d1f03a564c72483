"""Benchmark: what compaction saves on the headline rollout.

Runs the benchmark protocol's rollout (instructions and tools of ~2k tokens, a ~1k-token user
message, 25 tool turns with ~4k-token outputs) over HTTP against a server in this process,
chaining with ``previous_response_id``. Then it compacts the conversation and compares the
next turn both ways: continued from the full stored history, and started from the compacted
items. Figures: the prompt tokens of that next turn (``usage.input_tokens``), the server time
of the turn (client-observed time minus the engine's own ``stats.engine_ms``), and the time of
the compact call itself; medians over ``--repeats``. Run::

    python -m bidi_responses.bench.compaction --repeats 5

The engine is the simulated one with free prefill and a fast decode, so that the figures are
the API's work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import aiohttp
from bidi_responses.server.app import start_server

from .jsontypes import JSONObject
from .servers import fast_sim, sim_server_config
from .workload import Workload, WorkloadSpec, build_workload


async def run(spec: WorkloadSpec, repeats: int) -> JSONObject:
    """Run the rollout once, then measure the next turn ``repeats`` times each way."""
    workload = build_workload(spec)
    sim = fast_sim(tool_rounds=spec.tool_turns)
    with tempfile.TemporaryDirectory() as data_dir:
        config = sim_server_config(data_dir, sim)
        server = await start_server(config, http=True)
        try:
            base = f"http://127.0.0.1:{server.http_port}"
            timeout = aiohttp.ClientTimeout(total=60)
            async with aiohttp.ClientSession(base_url=base, timeout=timeout) as http:
                return await _measure(http, workload, repeats)
        finally:
            await server.stop(grace=0)


async def _post(http: aiohttp.ClientSession, path: str, body: JSONObject) -> JSONObject:
    async with http.post("/v1" + path, json=body) as reply:
        reply.raise_for_status()
        result: JSONObject = await reply.json()
    return result


async def _measure(http: aiohttp.ClientSession, workload: Workload, repeats: int) -> JSONObject:
    common = {"model": "sim-model", "instructions": workload.instructions, "tools": workload.tools}
    response = await _post(
        http, "/responses", {**common, "input": [workload.user_message("compaction")]}
    )
    turn = 0
    while calls := [i for i in response["output"] if i["type"] == "function_call"]:
        outputs = [
            {
                "type": "function_call_output",
                "call_id": c["call_id"],
                "output": workload.tool_output(turn),
            }
            for c in calls
        ]
        response = await _post(
            http, "/responses", {**common, "previous_response_id": response["id"], "input": outputs}
        )
        turn += 1
    last = response["id"]
    question = {"role": "user", "content": "Summarize what you changed."}

    compact_ms: list[float] = []
    compacted: JSONObject = {}
    for _ in range(repeats):
        start = time.perf_counter()
        compacted = await _post(
            http, "/responses/compact", {"model": "sim-model", "previous_response_id": last}
        )
        compact_ms.append((time.perf_counter() - start) * 1000)

    ways = {
        "full history": {**common, "previous_response_id": last, "input": [question]},
        "compacted": {**common, "input": [*compacted["output"], question]},
    }
    results: JSONObject = {}
    for name, body in ways.items():
        server_ms: list[float] = []
        tokens = 0
        for _ in range(repeats):
            start = time.perf_counter()
            reply = await _post(http, "/responses", body)
            elapsed = (time.perf_counter() - start) * 1000
            server_ms.append(elapsed - reply["stats"]["engine_ms"])
            tokens = reply["usage"]["input_tokens"]
        results[name] = {
            "input_tokens": tokens,
            "turn_ms_median": round(statistics.median(server_ms), 2),
            "turn_ms_spread": [round(min(server_ms), 2), round(max(server_ms), 2)],
        }
    return {
        "tool_turns": turn,
        "compact": {
            "ms_median": round(statistics.median(compact_ms), 2),
            "ms_spread": [round(min(compact_ms), 2), round(max(compact_ms), 2)],
            "input_tokens": compacted["usage"]["input_tokens"],
            "summary_tokens": compacted["usage"]["output_tokens"],
            "items_kept": len(compacted["output"]),
        },
        "next_turn": results,
    }


def main(argv: list[str] | None = None) -> None:
    """Command line: run and print (and optionally save) the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tool-turns", type=int, default=25)
    parser.add_argument("--tool-output-tokens", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args(argv)
    spec = replace(
        WorkloadSpec(), tool_turns=args.tool_turns, tool_output_tokens=args.tool_output_tokens
    )
    results = asyncio.run(run(spec, args.repeats))
    text = json.dumps(results, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
