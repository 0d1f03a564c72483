"""Bounded work per request, fair between streams: what one client's huge request costs others.

``python -m bidi_responses.bench.fairness latency`` (``make bench-fairness``) starts
``bidi-responses serve`` as a subprocess and measures a small gRPC Connect stream's turn time
(send to terminal event, chained turns) first with nothing else running, then while another
process sends creates with 10 MB ``instructions`` back to back (one character repeated, the
tokenizer's worst case, and ordinary prose), in the same run. The target: the small stream's
p99 stays within 50 ms of its idle p99.

``python -m bidi_responses.bench.fairness memory`` (``make bench-memory``) sends sixteen
near-limit (64 MiB) messages at once on each transport (a fresh server per transport) and
reports the server's RSS growth (peak over the burst minus the RSS before it) next to the
server-wide budget on request bytes (``limits.max_inflight_request_bytes``), and the status of
every message (each must be refused with a 4xx, never a 5xx). The target: growth under the
budget plus 100 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import multiprocessing
import multiprocessing.synchronize
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import grpc
import httpx
import orjson
import psutil
import websockets
from bidi_responses.client.aio import AsyncResponsesClient
from bidi_responses.v1 import responses_pb2 as pb

from .jsontypes import JSONObject
from .run import ServerProcess, ServerSettings
from .stats import percentile

MIB = 1024 * 1024
TARGET_P99_MS = 50.0
TARGET_RSS_SLACK_MB = 100.0
SERVICE = "/bidi_responses.v1.ResponsesService"


@dataclass(slots=True)
class FairnessSettings(ServerSettings):
    """The benchmark's server: a nearly free simulated engine, plus the bounds under test."""

    offload_chars: int | None = None
    max_inflight_request_bytes: int | None = None

    def toml(self) -> str:
        """The server's config file, with a ``[limits]`` table for the bounds that are set."""
        text = ServerSettings.toml(self)
        limits = [
            f"{name} = {int(value)}"
            for name, value in (
                ("offload_chars", self.offload_chars),
                ("max_inflight_request_bytes", self.max_inflight_request_bytes),
            )
            if value is not None
        ]
        return text + ("\n[limits]\n" + "\n".join(limits) + "\n" if limits else "")


def fast_settings(
    *, offload_chars: int | None = None, max_inflight_request_bytes: int | None = None
) -> FairnessSettings:
    """Short answers at once, so a turn's time is the API's own work."""
    return FairnessSettings(
        tokens_per_second=1_000_000.0,
        ttft_ms=0.0,
        prefill_tokens_per_second=1e12,
        tool_rounds=0,
        answer_tokens=20,
        offload_chars=offload_chars,
        max_inflight_request_bytes=max_inflight_request_bytes,
    )


def big_text(kind: str, chars: int) -> str:
    """``chars`` characters of one letter (``run``) or of ordinary prose (``prose``)."""
    if kind == "run":
        return "a" * chars
    sentence = "The quick brown fox jumps over the lazy dog 12345 times, it's said. "
    return (sentence * (chars // len(sentence) + 1))[:chars]


# -- latency -------------------------------------------------------------------------------


def _big_sender(
    target: str,
    kind: str,
    chars: int,
    started: multiprocessing.synchronize.Event,
    stop: multiprocessing.synchronize.Event,
    results: Connection,
) -> None:
    """In its own process: creates with huge instructions, back to back, until ``stop`` is
    set; sends back how many completed and how long each took (s)."""

    async def run() -> list[float]:
        durations: list[float] = []
        instructions = big_text(kind, chars)
        async with AsyncResponsesClient(target) as client, client.connect() as stream:
            while not stop.is_set():
                begun = time.perf_counter()
                started.set()
                response = await stream.create(
                    model="sim-model", instructions=instructions, input="go", store=False
                )
                assert response.status == "completed", response.status
                durations.append(time.perf_counter() - begun)
        return durations

    durations = asyncio.run(run())
    results.send({"big_creates": len(durations), "big_p50_s": percentile(durations, 50)})


async def _small_turns(target: str, seconds: float, turns: int) -> list[float]:
    """A chained small conversation: the time of each turn, in ms."""
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    async with AsyncResponsesClient(target) as client, client.connect() as stream:
        previous: str | None = None
        while len(times) < turns or time.perf_counter() < deadline:
            begun = time.perf_counter()
            response = await stream.create(
                model="sim-model",
                input="Run the tests.",
                previous_response_id=previous,
                store=False,
            )
            times.append((time.perf_counter() - begun) * 1000)
            previous = response.id
            if len(times) >= turns and time.perf_counter() >= deadline:
                break
    return times


def measure_latency(
    kind: str, chars: int, turns: int, seconds: float, workdir: Path, offload_chars: int | None
) -> JSONObject:
    """Idle, then loaded small-stream turn times on one server (same run)."""
    settings = fast_settings(offload_chars=offload_chars)
    with ServerProcess(settings, workdir, f"latency-{kind}") as server:
        assert server.address is not None
        target = f"127.0.0.1:{server.address.grpc_port}"
        asyncio.run(_small_turns(target, 0.0, 20))  # warm-up
        idle = asyncio.run(_small_turns(target, seconds, turns))
        context = multiprocessing.get_context("spawn")
        started, stop = context.Event(), context.Event()
        reader, writer = context.Pipe(duplex=False)
        sender = context.Process(
            target=_big_sender, args=(target, kind, chars, started, stop, writer)
        )
        sender.start()
        try:
            if not started.wait(60):
                raise RuntimeError("the big sender did not start")
            loaded = asyncio.run(_small_turns(target, seconds, turns))
        finally:
            stop.set()
            sender.join(120)
            if sender.is_alive():
                sender.terminate()
        big: JSONObject = reader.recv() if reader.poll(1) else {}
    return {
        "kind": kind,
        "chars": chars,
        "offload_chars": offload_chars if offload_chars is not None else "default",
        "idle_turns": len(idle),
        "idle_p50_ms": percentile(idle, 50),
        "idle_p99_ms": percentile(idle, 99),
        "loaded_turns": len(loaded),
        "loaded_p50_ms": percentile(loaded, 50),
        "loaded_p99_ms": percentile(loaded, 99),
        "loaded_max_ms": max(loaded),
        "p99_delta_ms": percentile(loaded, 99) - percentile(idle, 99),
        **big,
    }


def latency_table(rows: Sequence[JSONObject]) -> str:
    """The latency benchmark's table."""
    lines = [
        f"{'input':<8}{'offload':>10}{'idle n':>8}{'idle p50':>10}{'idle p99':>10}"
        f"{'load n':>8}{'load p50':>10}{'load p99':>10}{'load max':>10}{'Δp99':>9}"
        f"{'verdict':>9}"
    ]
    for row in rows:
        verdict = "ok" if row["p99_delta_ms"] <= TARGET_P99_MS else "MISSED"
        lines.append(
            f"{row['kind']:<8}{row['offload_chars']!s:>10}{row['idle_turns']:>8}"
            f"{row['idle_p50_ms']:>10.1f}{row['idle_p99_ms']:>10.1f}{row['loaded_turns']:>8}"
            f"{row['loaded_p50_ms']:>10.1f}{row['loaded_p99_ms']:>10.1f}"
            f"{row['loaded_max_ms']:>10.1f}{row['p99_delta_ms']:>+9.1f}{verdict:>9}"
        )
    return "\n".join(lines)


# -- memory --------------------------------------------------------------------------------


def near_limit_body(limit_bytes: int) -> bytes:
    """A JSON create body just under ``limit_bytes`` (its instructions fill it)."""
    head = {"model": "sim-model", "input": "hi", "store": False, "instructions": ""}
    overhead = len(orjson.dumps(head)) + 1024
    return orjson.dumps({**head, "instructions": "m" * (limit_bytes - overhead)})


async def _send_http(port: int, body: bytes) -> str:
    async with httpx.AsyncClient(timeout=120) as client:
        reply = await client.post(
            f"http://127.0.0.1:{port}/v1/responses",
            content=body,
            headers={"content-type": "application/json"},
        )
        return f"http {reply.status_code}"


async def _send_ws(port: int, text: str) -> str:
    async with websockets.connect(
        f"ws://127.0.0.1:{port}/v1/responses", max_size=None, compression=None
    ) as ws:
        try:
            await ws.send(text)
            event = orjson.loads(await ws.recv())
        except websockets.ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd is not None else "none"
            return f"ws close {code}"
        return f"ws {event.get('type')} {event.get('status', '')}".strip()


def unlimited_channel(port: int) -> grpc.aio.Channel:
    """A channel of its own (no shared connection) with no message size limits: for sending
    messages up to and past the server's own limit."""
    return grpc.aio.insecure_channel(
        f"127.0.0.1:{port}",
        options=[
            ("grpc.max_send_message_length", -1),
            ("grpc.max_receive_message_length", -1),
            ("grpc.use_local_subchannel_pool", 1),
        ],
    )


async def _send_grpc_unary(port: int, message: bytes) -> str:
    async with unlimited_channel(port) as channel:
        method: grpc.aio.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(
            f"{SERVICE}/CreateResponse"
        )
        call = method(message)
        try:
            async for _ in call:
                pass
        except grpc.aio.AioRpcError as error:
            return f"grpc {error.code().name}"
        return "grpc OK"


async def _send_grpc_connect(port: int, message: bytes) -> str:
    async with unlimited_channel(port) as channel:
        method: grpc.aio.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(
            f"{SERVICE}/Connect"
        )
        call = method()
        try:
            await call.write(message)
            reply = await call.read()
            await call.done_writing()
            call.cancel()
        except grpc.aio.AioRpcError as error:
            return f"grpc {error.code().name}"
        if not isinstance(reply, bytes):
            return "grpc closed"
        event = pb.ConnectResponse.FromString(reply)
        if event.HasField("error"):
            return f"connect error {event.error.status}"
        return f"connect {event.WhichOneof('event')}"


async def _sample_rss(pid: int, peak: list[int], stop: asyncio.Event) -> None:
    process = psutil.Process(pid)
    while not stop.is_set():
        peak[0] = max(peak[0], process.memory_info().rss)
        await asyncio.sleep(0.01)


async def _burst(
    server: ServerProcess, transport: str, messages: int, limit_bytes: int
) -> tuple[list[str], int, int]:
    """``messages`` near-limit messages at once; (their outcomes, RSS before, peak RSS)."""
    address = server.address
    assert address is not None and address.pid is not None
    body = near_limit_body(limit_bytes)
    grpc_port, http_port = address.grpc_port, address.http_port or 0
    send: Callable[[], Awaitable[str]]
    if transport == "http":
        send = functools.partial(_send_http, http_port, body)
    elif transport == "websocket":
        text = orjson.dumps({"type": "response.create", **orjson.loads(body)}).decode()
        send = functools.partial(_send_ws, http_port, text)
    else:
        instructions = orjson.loads(body)["instructions"]
        params = pb.ResponseCreateParams(model="sim-model", instructions=instructions)
        if transport == "grpc-unary":
            raw = pb.CreateResponseRequest(params=params).SerializeToString()
            send = functools.partial(_send_grpc_unary, grpc_port, raw)
        else:
            raw = pb.ConnectRequest(response_create=params).SerializeToString()
            send = functools.partial(_send_grpc_connect, grpc_port, raw)
    await asyncio.sleep(1.0)  # let the server settle after start-up
    before = psutil.Process(address.pid).memory_info().rss
    peak = [before]
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample_rss(address.pid, peak, stop))
    try:
        outcomes = await asyncio.gather(*(send() for _ in range(messages)))
        await asyncio.sleep(0.5)  # what the server still holds right after
    finally:
        stop.set()
        await sampler
    return [str(outcome) for outcome in outcomes], before, peak[0]


def measure_memory(
    transport: str, messages: int, workdir: Path, budget_bytes: int | None, limit_bytes: int
) -> JSONObject:
    """One transport on a fresh server."""
    settings = fast_settings(max_inflight_request_bytes=budget_bytes)
    with ServerProcess(settings, workdir, f"memory-{transport}") as server:
        outcomes, before, peak = asyncio.run(_burst(server, transport, messages, limit_bytes))
        alive = server.proc is not None and server.proc.poll() is None
    budget = budget_bytes if budget_bytes is not None else 256 * MIB
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome] = counts.get(outcome, 0) + 1
    growth_mb = (peak - before) / MIB
    return {
        "transport": transport,
        "messages": messages,
        "message_mb": limit_bytes / MIB,
        "budget_mb": budget / MIB,
        "rss_before_mb": before / MIB,
        "rss_peak_mb": peak / MIB,
        "growth_mb": growth_mb,
        "target_mb": budget / MIB + TARGET_RSS_SLACK_MB,
        "outcomes": counts,
        "server_alive": alive,
        "no_5xx": not any(
            o.startswith(("http 5", "grpc INTERNAL", "grpc UNKNOWN", "connect error 5"))
            for o in outcomes
        ),
    }


def memory_table(rows: Sequence[JSONObject]) -> str:
    """The memory benchmark's table."""
    lines = [
        f"{'transport':<14}{'budget MB':>10}{'RSS before':>12}{'peak':>8}{'growth':>8}"
        f"{'target':>8}{'verdict':>9}  outcomes"
    ]
    for row in rows:
        ok = row["growth_mb"] <= row["target_mb"] and row["no_5xx"] and row["server_alive"]
        outcomes = ", ".join(f"{n} x {k}" for k, n in sorted(row["outcomes"].items()))
        lines.append(
            f"{row['transport']:<14}{row['budget_mb']:>10.0f}{row['rss_before_mb']:>12.0f}"
            f"{row['rss_peak_mb']:>8.0f}{row['growth_mb']:>8.0f}{row['target_mb']:>8.0f}"
            f"{'ok' if ok else 'MISSED':>9}  {outcomes}"
        )
    return "\n".join(lines)


# -- command line --------------------------------------------------------------------------

TRANSPORTS = ("grpc-unary", "grpc-connect", "http", "websocket")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: print the table(s); exit 1 if a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    latency = sub.add_parser("latency", help="small-stream turn time while 10 MB creates run")
    latency.add_argument("--kinds", default="run,prose", help="big inputs: run, prose")
    latency.add_argument("--chars", type=int, default=10_000_000, help="big instructions")
    latency.add_argument("--turns", type=int, default=300, help="small turns per phase (min)")
    latency.add_argument("--seconds", type=float, default=10.0, help="seconds per phase (min)")
    latency.add_argument(
        "--offload-chars", type=int, default=None, help="limits.offload_chars (server default)"
    )
    memory = sub.add_parser("memory", help="RSS under 16 parallel near-limit messages")
    memory.add_argument("--transports", default=",".join(TRANSPORTS))
    memory.add_argument("--messages", type=int, default=16)
    memory.add_argument("--message-mb", type=float, default=64.0)
    memory.add_argument(
        "--budget-mb", type=float, default=None, help="limits.max_inflight_request_bytes"
    )
    for command in (latency, memory):
        command.add_argument("--json", action="store_true", help="JSON rows, not a table")
        command.add_argument("--workdir", default=None, help="keep servers' data and logs here")
    args = parser.parse_args(argv)
    with (
        contextlib.nullcontext(args.workdir)
        if args.workdir
        else tempfile.TemporaryDirectory(prefix="fairness-")
    ) as workdir:
        if args.command == "latency":
            rows = [
                measure_latency(
                    kind, args.chars, args.turns, args.seconds, Path(workdir), args.offload_chars
                )
                for kind in args.kinds.split(",")
            ]
            table = latency_table(rows)
            missed = any(row["p99_delta_ms"] > TARGET_P99_MS for row in rows)
        else:
            limit = int(args.message_mb * MIB)
            budget = int(args.budget_mb * MIB) if args.budget_mb is not None else None
            rows = [
                measure_memory(transport, args.messages, Path(workdir), budget, limit)
                for transport in args.transports.split(",")
            ]
            table = memory_table(rows)
            missed = any(row["growth_mb"] > row["target_mb"] or not row["no_5xx"] for row in rows)
    print(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() if args.json else table)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
