"""``make peers``: this project's turns against SMG's pass-through, behind one instant fake model.

One process, ``bench.peers_model``, is the model of every server: this project's server reaches
it through its production ``completions`` route (token ids), SMG (``smg launch --backend openai
--history-backend memory``, a Rust gateway that keeps the history in memory and forwards
``/v1/responses`` with the whole history as input) through its Responses endpoint. The model
answers at once and reports its own time (``GET /stats``), so a turn's **API overhead** is the
time the client observed minus the model's, and its **server CPU** is the server process's
CPU clock across the turn (``bench.cpu``: to the nanosecond, all threads; for SMG the gateway
and any process it started).

The workload is one agent loop of ``--turns`` turns (the first a user message, then one tool
output per turn: 2-4 KB each, the benchmark's 8 tools, ~1.3 KB of instructions). Modes:

- ``http_full``: ``POST /v1/responses`` (SSE) with the whole history each turn, ``store: false``;
- ``http_previous``: only the new input and ``previous_response_id``, ``store: true`` (the SDK's
  default);
- ``websocket`` (this project): WebSocket mode, one connection per loop, ``previous_response_id``,
  ``store: false``;
- ``connect`` (this project): one gRPC Connect stream per loop, the same.

Each cell runs one warm-up loop, then ``--repeats`` loops; the cells take turns within a repeat,
so slow drift of the shared machine falls on every cell alike. Figures per cell: the first
turn, the last, and the median tool turn (each loop's median over its tool turns), each the
median over the repeats with their range, from one run. Written to ``OUT/peers.json``, which
``compare`` and ``make report`` put in docs/results.md. Without ``--smg`` (or when it cannot
start) the SMG cells are recorded as skipped with the reason.

Run: ``python -m bidi_responses.bench.peers --smg .venv-peers/bin/smg --out bench-out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from .http_continuation import Send, websocket_turns
from .jsontypes import JSONObject
from .peer_processes import HelperProcess, SmgGateway
from .run.server import ServerProcess
from .run.settings import ServerSettings
from .stats import median
from .workload import Workload, WorkloadSpec, build_workload

__all__ = [
    "MODES",
    "channel",
    "main",
    "model_process",
    "peers_workload",
    "run_peers",
    "server_settings",
]

#: This project's modes, then SMG's (it has neither WebSocket mode nor gRPC).
MODES: dict[str, tuple[str, ...]] = {
    "bidi": ("http_full", "http_previous", "websocket", "connect"),
    "smg": ("http_full", "http_previous"),
}
MODE_LABELS = {
    "http_full": "HTTP full history",
    "http_previous": "HTTP `previous_response_id`",
    "websocket": "WebSocket mode",
    "connect": "gRPC Connect",
}
SERVER_LABELS = {"bidi": "this project", "smg": "SMG (pass-through, history in memory)"}


@dataclass(slots=True)
class Turn:
    wall_ms: float
    model_ms: float
    cpu_ms: float

    @property
    def overhead_ms(self) -> float:
        return self.wall_ms - self.model_ms


def _events(raw: bytes) -> JSONObject | None:
    line = raw.strip()
    if not line.startswith(b"data:"):
        return None
    event: JSONObject = json.loads(line[5:])
    return event


def _http(session: aiohttp.ClientSession, url: str) -> Send:
    async def send(body: JSONObject) -> JSONObject:
        response: JSONObject | None = None
        async with session.post(url + "/v1/responses", json={**body, "stream": True}) as reply:
            reply.raise_for_status()
            # Read to the end of the body: a connection left mid-body is closed, not reused,
            # and every turn would then pay a new connection.
            async for raw in reply.content:
                event = _events(raw)
                if event is None:
                    continue
                if event.get("type") in ("error", "response.failed"):
                    raise RuntimeError(f"error event: {event}")
                if event.get("type") == "response.completed":
                    completed = event["response"]
                    assert isinstance(completed, dict)
                    response = completed
        if response is None:
            raise RuntimeError("the stream ended without response.completed")
        return response

    return send


@asynccontextmanager
async def _websocket(url: str) -> AsyncIterator[Send]:
    from websockets.asyncio.client import connect

    async with connect(url.replace("http://", "ws://") + "/v1/responses", max_size=None) as ws:
        yield websocket_turns(ws)


@asynccontextmanager
async def _connect(target: str) -> AsyncIterator[Send]:
    from bidi_responses.client import AsyncResponsesClient

    async with AsyncResponsesClient(target) as client, client.connect() as stream:

        async def send(body: JSONObject) -> JSONObject:
            response = await stream.create(**body)
            if response.error is not None:
                raise RuntimeError(f"error: {response.error}")
            return dict(response.raw)

        yield send


async def _loop(
    send: Send,
    mode: str,
    workload: Workload,
    turns: int,
    nonce: str,
    model_ms: Callable[[], Awaitable[float]],
    cpu_s: Callable[[], float],
) -> list[Turn]:
    """One agent loop; per turn its wall, model and server CPU time.

    The CPU windows are contiguous (each turn's ends where the next one's starts), so work the
    server does after its last event of a turn is counted in that turn, not lost.
    """
    common: JSONObject = {
        "model": "sim-model",
        "instructions": workload.instructions,
        "tools": list(workload.tools),
        "store": mode == "http_previous",
    }
    history: list[JSONObject] = [workload.user_message(nonce)]
    new_input = list(history)
    previous: str | None = None
    figures: list[Turn] = []
    cpu0 = cpu_s()
    for turn in range(turns):
        body: JSONObject = dict(common)
        if mode == "http_full":
            body["input"] = list(history)
        else:
            body["input"] = list(new_input)
            if previous is not None:
                body["previous_response_id"] = previous
        model0 = await model_ms()
        started = time.perf_counter()
        response = await send(body)
        wall_ms = (time.perf_counter() - started) * 1000
        model1 = await model_ms()
        cpu1 = cpu_s()
        figures.append(Turn(wall_ms, model1 - model0, (cpu1 - cpu0) * 1000))
        cpu0 = cpu1
        output = response["output"]
        assert isinstance(output, list)
        calls = [i for i in output if isinstance(i, dict) and i.get("type") == "function_call"]
        if turn + 1 < turns and not calls:
            raise RuntimeError(f"{mode}: turn {turn + 1} called no tool")
        new_input = [
            {"type": "function_call_output", "call_id": c["call_id"], "output": out}
            for c, out in zip(calls, [workload.tool_output(turn)] * len(calls), strict=True)
        ]
        history += [i for i in output if isinstance(i, dict)] + new_input
        response_id = response["id"]
        assert isinstance(response_id, str)
        previous = response_id
    return figures


def _spread(values: Sequence[float]) -> JSONObject:
    return {"median": median(values), "min": min(values), "max": max(values)}


def summarize(loops: list[list[Turn]]) -> JSONObject:
    """First turn, last turn and the median tool turn: medians over the loops, with range."""
    out: JSONObject = {"repeats": len(loops)}
    for figure in ("overhead_ms", "cpu_ms", "wall_ms", "model_ms"):
        per: JSONObject = {
            "first": _spread([getattr(loop[0], figure) for loop in loops]),
            "last": _spread([getattr(loop[-1], figure) for loop in loops]),
            # Tool turns: every turn after the first answers a tool call.
            "tool_turn": _spread(
                [median(getattr(t, figure) for t in loop[1:]) for loop in loops if len(loop) > 1]
            ),
        }
        out[figure] = per
    return out


def model_process(workdir: Path, turns: int) -> HelperProcess:
    """The instant fake model (``bench.peers_model``) for loops of ``turns`` turns, started."""
    return HelperProcess(
        [
            sys.executable,
            "-m",
            "bidi_responses.bench.peers_model",
            "--tool-rounds",
            str(turns - 1),
        ],
        workdir / "model.log",
    )


def peers_workload(turns: int) -> Workload:
    """The benchmark's agent loop of ``turns`` turns (module docstring)."""
    return build_workload(
        WorkloadSpec(
            tool_turns=turns, tool_output_tokens=800, user_tokens=300, instructions_tokens=300
        )
    )


def server_settings(model_url: str, turns: int) -> ServerSettings:
    """This project's server as the benchmark runs it: the fake model at ``model_url`` as its
    completions backend, a tool call each turn but the last."""
    return ServerSettings(
        tokens_per_second=1_000_000,
        ttft_ms=0,
        prefill_tokens_per_second=1e9,
        tool_rounds=turns - 1,
        function_call_tokens=40,
        answer_tokens=50,
        sim_backend_url=model_url,
    )


async def run_peers(
    workdir: Path, smg: str | None, turns: int = 20, repeats: int = 3
) -> JSONObject:
    """Every cell of the benchmark (module docstring); the JSON of ``peers.json``."""
    workload = peers_workload(turns)
    model = model_process(workdir, turns)
    procs: list[HelperProcess | ServerProcess] = [model]
    result: JSONObject = {
        "turns": turns,
        "repeats": repeats,
        "workload": {**workload.to_json(), "instructions_bytes": len(workload.instructions)},
    }
    cells_out: dict[str, JSONObject] = {}
    skipped: dict[str, str] = {}
    try:
        model_url = model.wait_url()
        bidi = ServerProcess(server_settings(model_url, turns), workdir, "bidi")
        procs.append(bidi)
        address = bidi.start()
        bidi_url = f"http://127.0.0.1:{address.http_port}"
        servers: dict[str, tuple[str, Callable[[], float]]] = {"bidi": (bidi_url, bidi.cpu_seconds)}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            smg_proc: SmgGateway | None = None
            if smg is None:
                skipped["smg"] = "SMG is not installed (make peers installs it)"
            else:
                smg_proc = SmgGateway(smg, model_url, workdir / "smg.log")
                procs.append(smg_proc)
                try:
                    await smg_proc.wait_ready(session)
                    servers["smg"] = (smg_proc.url, smg_proc.cpu_seconds)
                except RuntimeError as exc:
                    skipped["smg"] = f"SMG did not start: {exc}"

            async def model_ms() -> float:
                async with session.get(model_url.removesuffix("/v1") + "/stats") as reply:
                    stats = await reply.json()
                return float(stats["model_ms"])

            def server_channel(server: str, mode: str) -> AbstractAsyncContextManager[Send]:
                grpc_target = f"127.0.0.1:{address.grpc_port}"
                return channel(session, servers[server][0], grpc_target, mode)

            cells = [(s, m) for s in servers for m in MODES[s]]
            loops: dict[str, list[list[Turn]]] = {f"{s}.{m}": [] for s, m in cells}
            for r in range(repeats + 1):  # round 0 warms every path
                for server, mode in cells:
                    async with server_channel(server, mode) as send:
                        figures = await _loop(
                            send,
                            mode,
                            workload,
                            turns,
                            f"{server} {mode} {r}",
                            model_ms,
                            servers[server][1],
                        )
                    if r:
                        loops[f"{server}.{mode}"].append(figures)
            for key, cell_loops in loops.items():
                server, mode = key.split(".")
                cells_out[key] = {
                    "server": server,
                    "mode": mode,
                    **summarize(cell_loops),
                    "per_turn_overhead_ms": [
                        median(loop[t].overhead_ms for loop in cell_loops) for t in range(turns)
                    ],
                    "per_turn_cpu_ms": [
                        median(loop[t].cpu_ms for loop in cell_loops) for t in range(turns)
                    ],
                }
    finally:
        for proc in reversed(procs):
            proc.stop()
    result["cells"] = cells_out
    result["skipped"] = skipped
    return result


@asynccontextmanager
async def _plain(send: Send) -> AsyncIterator[Send]:
    yield send


def channel(
    session: aiohttp.ClientSession, url: str, grpc_target: str, mode: str
) -> AbstractAsyncContextManager[Send]:
    """How one loop of ``mode`` sends its turns: a WebSocket-mode connection, a Connect stream,
    or HTTP requests on ``session`` (the server's HTTP base ``url``, its gRPC ``grpc_target``)."""
    if mode == "websocket":
        return _websocket(url)
    if mode == "connect":
        return _connect(grpc_target)
    return _plain(_http(session, url))


def format_table(result: JSONObject) -> str:
    """One line per cell: overhead and server CPU, median tool turn, first and last turn."""
    lines = [
        "cell                      overhead ms: tool turn [range]  first  last"
        "   | server CPU ms: tool turn [range]  first  last"
    ]
    cells = result["cells"]
    assert isinstance(cells, dict)
    for key, cell in cells.items():
        assert isinstance(cell, dict)
        o, c = cell["overhead_ms"], cell["cpu_ms"]
        assert isinstance(o, dict) and isinstance(c, dict)
        o_ends = f"{o['first']['median']:6.2f} {o['last']['median']:6.2f}"
        c_ends = f"{c['first']['median']:6.2f} {c['last']['median']:6.2f}"
        lines.append(
            f"{key:<26}{_fmt(o['tool_turn'])}  {o_ends}   | {_fmt(c['tool_turn'])}  {c_ends}"
        )
    skipped = result["skipped"]
    assert isinstance(skipped, dict)
    lines += [f"{name}: skipped, {reason}" for name, reason in skipped.items()]
    return "\n".join(lines)


def _fmt(spread: JSONObject) -> str:
    return f"{spread['median']:6.2f} [{spread['min']:6.2f}-{spread['max']:6.2f}]"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--smg", help="the smg command (its own venv); without it SMG is skipped")
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    args = parser.parse_args(argv)
    smg = args.smg if args.smg and Path(args.smg).is_file() else None
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        result = asyncio.run(run_peers(Path(tmp), smg, args.turns, args.repeats))
    skipped = result["skipped"]
    if smg is not None and isinstance(skipped, dict) and "smg" not in skipped:
        version = subprocess.run([smg, "--version"], capture_output=True, text=True, check=False)
        result["smg_version"] = version.stdout.strip()
    command = "make peers" if smg else "python -m bidi_responses.bench.peers"
    result["command"] = f"{command} (--turns {args.turns} --repeats {args.repeats})"
    print(format_table(result))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peers.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
