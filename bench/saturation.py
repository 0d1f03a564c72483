"""Saturation: N streams at once on one server process, each asking a long answer of a fast
simulated engine; the median stream's delivered tokens per second, per transport and client.

Every stream is opened first (a WebSocket connection, or a Connect call whose headers have
come back). Once all of them are open, in every client process, each sends one
``response.create`` at the same moment and reads its answer to the end. Its delivered rate is
its output tokens over the time from sending its create to its terminal event; against the
engine's own rate that says whether the server kept up. Opening is timed on its own (``open``):
a burst of opens is a different load from a burst of requests, and grpc.aio admits calls one at
a time where an asyncio listener accepts a backlog at once, so folding the two together
would measure the opening ramp, not serving. SSE has no stream to open before its request: its
POST is sent at the common moment and its connection setup counts in its rate.

Transports and clients:

- ``websocket``: WebSocket mode, JSON text frames (the ``websockets`` library);
- ``sse``: POST /v1/responses with SSE (aiohttp);
- ``connect``: Connect from stock generated stubs that set no options (one event a message);
- ``connect_batched``: Connect with ``DeliveryOptions.batch_events``.

Connect streams share one channel (one HTTP/2 connection) per client process; WebSocket and
SSE open a connection per stream.

Every stream is also checked: all the tokens arrived (usage and the engine's answer length),
its deltas concatenate to ``output_text.done`` (merged deltas included), and its sequence
numbers increase. Clients run in ``--client-processes`` processes, so that the client's own
per-message cost does not cap what is measured.

    python -m bidi_responses.bench.saturation --streams 50,100,200
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import orjson
import websockets
from bidi_responses.codec import params_to_pb, unbatch
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc

from .clients import ServerAddress
from .run import ServerProcess, ServerSettings
from .stats import median

TRANSPORTS = ("websocket", "sse", "connect", "connect_batched")
_TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")
_PB_TERMINAL = {"response_completed", "response_incomplete", "response_failed", "error"}


@dataclass
class StreamResult:
    """What one stream received."""

    tokens: int = 0  # usage.output_tokens of its terminal event
    status: str = ""
    text: str = ""  # the concatenated deltas
    done_text: str = ""  # output_text.done
    messages: int = 0  # wire messages: gRPC messages, WebSocket frames, SSE events
    deltas: int = 0
    increasing: bool = True  # sequence numbers strictly increasing
    began: float = 0.0  # when opening the stream began (perf_counter)
    opened: float = 0.0  # when it was open: connection and handshake, or call and headers
    sent: float = 0.0  # when the create was sent (perf_counter)
    first_delta: float = 0.0
    end: float = 0.0

    @property
    def rate(self) -> float:
        """Delivered tokens per second, from sending the create to the terminal event (the
        engine starts at once: no time to first token)."""
        span = self.end - self.sent
        return self.tokens / span if span > 0 and self.sent else 0.0

    @property
    def open_s(self) -> float:
        """Opening the stream, before any create."""
        return self.opened - self.began

    @property
    def streaming_rate(self) -> float:
        """Tokens per second once streaming, first delta to terminal event."""
        span = self.end - self.first_delta
        return self.tokens / span if span > 0 and self.first_delta else 0.0

    def correct(self, answer_tokens: int) -> bool:
        """Every token arrived and the deltas rebuild the text exactly."""
        return (
            self.status == "completed"
            and self.tokens == answer_tokens
            and self.text == self.done_text
            and bool(self.text)
            and self.increasing
        )


class _Seen:
    """Folds events (as JSON) into a ``StreamResult``."""

    def __init__(self) -> None:
        self.result = StreamResult()
        self._last_seq = -1

    def event(self, data: dict[str, Any]) -> bool:
        """Take one event; True once it was the terminal one."""
        r = self.result
        seq = data.get("sequence_number")
        if isinstance(seq, int):
            r.increasing = r.increasing and seq > self._last_seq
            self._last_seq = seq
        kind = data["type"]
        if kind == "response.output_text.delta":
            if not r.first_delta:
                r.first_delta = time.perf_counter()
            r.deltas += 1
            r.text += data["delta"]
        elif kind == "response.output_text.done":
            r.done_text = data["text"]
        elif kind in _TERMINAL:
            r.end = time.perf_counter()
            response = data.get("response") or {}
            r.status = response.get("status", "error")
            r.tokens = int((response.get("usage") or {}).get("output_tokens", 0))
            return True
        return False


def _body(stream: int) -> dict[str, Any]:
    return {"model": "sim-model", "input": f"write the report, part {stream}"}


class _Start:
    """Lets every stream's create go at one moment, once every stream is open.

    ``everyone_open`` runs when this process's streams are all open; it waits for the other
    client processes' (a barrier), so that the creates of every process go together.
    """

    def __init__(self, streams: int, everyone_open: Callable[[], Awaitable[None]]) -> None:
        self._waiting = streams
        self._everyone_open = everyone_open
        self._go = asyncio.Event()

    async def opened(self, result: StreamResult, began: float) -> None:
        """Count ``result``'s stream as open; return when every stream may send its create."""
        result.began, result.opened = began, time.perf_counter()
        self._waiting -= 1
        if self._waiting == 0:
            await self._everyone_open()
            self._go.set()
        await self._go.wait()


async def _websocket(address: ServerAddress, stream: int, start: _Start) -> StreamResult:
    seen = _Seen()
    url = f"ws://{address.host}:{address.http_port}/v1/responses"
    began = time.perf_counter()
    async with websockets.connect(url, max_size=None, compression=None) as ws:
        await start.opened(seen.result, began)
        seen.result.sent = time.perf_counter()
        await ws.send(orjson.dumps({"type": "response.create", **_body(stream)}).decode())
        async for frame in ws:
            seen.result.messages += 1
            if seen.event(orjson.loads(frame)):
                break
    return seen.result


async def _sse(
    address: ServerAddress, stream: int, http: aiohttp.ClientSession, start: _Start
) -> StreamResult:
    seen = _Seen()
    url = f"http://{address.host}:{address.http_port}/v1/responses"
    await start.opened(seen.result, time.perf_counter())  # nothing to open before the POST
    seen.result.sent = time.perf_counter()
    async with http.post(url, json={**_body(stream), "stream": True}) as resp:
        buffer = b""
        async for chunk in resp.content.iter_any():
            buffer += chunk
            *blocks, buffer = buffer.split(b"\n\n")
            for block in blocks:
                for line in block.split(b"\n"):
                    if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                        seen.result.messages += 1
                        if seen.event(orjson.loads(line[5:])):
                            return seen.result
    return seen.result


def _pb_event(event: pb.ConnectResponse) -> dict[str, Any]:
    """The few fields of a stock-decoded event this benchmark reads, as JSON names."""
    which = event.WhichOneof("event") or ""
    payload = getattr(event, which)
    data: dict[str, Any] = {"type": "response." + which.removeprefix("response_")}
    data["sequence_number"] = getattr(payload, "sequence_number", None)
    if which == "response_output_text_delta":
        data["type"], data["delta"] = "response.output_text.delta", payload.delta
    elif which == "response_output_text_done":
        data["type"], data["text"] = "response.output_text.done", payload.text
    elif which in _PB_TERMINAL:
        data["type"] = "error" if which == "error" else "response." + which[len("response_") :]
        if which != "error":
            response = payload.response
            data["response"] = {
                "status": response.status,  # the status string, as in JSON
                "usage": {"output_tokens": response.usage.output_tokens},
            }
    return data


async def _connect(
    channel: grpc.aio.Channel, stream: int, batched: bool, start: _Start
) -> StreamResult:
    seen = _Seen()
    request = pb.ConnectRequest(response_create=params_to_pb(_body(stream)))
    if batched:
        request.delivery.batch_events = True
    go = asyncio.Event()
    finished = asyncio.Event()

    async def requests() -> AsyncIterator[pb.ConnectRequest]:
        await go.wait()
        seen.result.sent = time.perf_counter()
        yield request
        await finished.wait()  # half-close once the answer is in

    began = time.perf_counter()
    call = pb_grpc.ResponsesServiceStub(channel).Connect(requests())
    # The server sends its headers as soon as it has admitted the call: the stream is open.
    await call.initial_metadata()
    await start.opened(seen.result, began)
    go.set()
    async for message in call:
        seen.result.messages += 1
        if any(seen.event(_pb_event(e)) for e in unbatch(message)):
            finished.set()
            break
    call.cancel()
    return seen.result


async def _alone() -> None:
    """No other client process to wait for."""


async def run_streams(
    address: ServerAddress,
    transport: str,
    streams: Sequence[int],
    start_at: float,
    everyone_open: Callable[[], Awaitable[None]] = _alone,
) -> list[StreamResult]:
    """Run ``streams`` at once on ``transport``: open them from wall-clock ``start_at`` on,
    then, once ``everyone_open`` returns, send every create together."""
    connector = aiohttp.TCPConnector(limit=0)
    target = f"{address.host}:{address.grpc_port}"
    # One gRPC channel (HTTP/2 connection) per client process, as a gRPC client would have,
    # connected before the streams start.
    async with (
        aiohttp.ClientSession(connector=connector) as http,
        grpc.aio.insecure_channel(target) as channel,
    ):
        if transport.startswith("connect"):
            await channel.channel_ready()
        await asyncio.sleep(max(start_at - time.time(), 0))  # every client process at once

        start = _Start(len(streams), everyone_open)

        async def one(stream: int) -> StreamResult:
            if transport == "websocket":
                return await _websocket(address, stream, start)
            if transport == "sse":
                return await _sse(address, stream, http, start)
            return await _connect(channel, stream, transport == "connect_batched", start)

        return list(await asyncio.gather(*(one(s) for s in streams)))


def _client_process(
    address: ServerAddress,
    transport: str,
    streams: list[int],
    start_at: float,
    barrier: threading.Barrier,
    timeout_s: float,
) -> tuple[list[dict[str, Any]], float]:
    """One client process's streams, and the CPU seconds it spent on them."""

    async def everyone_open() -> None:
        # Blocks a thread, not the loop: the other streams' opens are still being answered.
        await asyncio.to_thread(barrier.wait, timeout_s)

    results = asyncio.run(run_streams(address, transport, streams, start_at, everyone_open))
    return [asdict(r) for r in results], time.process_time()


def measure(
    address: ServerAddress, transport: str, streams: int, processes: int, timeout_s: float
) -> tuple[list[StreamResult], float]:
    """``streams`` streams on ``transport`` from ``processes`` client processes; the results
    and the client processes' CPU seconds."""
    shares = [share for i in range(processes) if (share := list(range(i, streams, processes)))]
    start_at = time.time() + 1.0 + 0.2 * processes  # after every process has imported
    with multiprocessing.Manager() as manager, ProcessPoolExecutor(processes) as pool:
        barrier = manager.Barrier(len(shares))
        futures = [
            pool.submit(_client_process, address, transport, share, start_at, barrier, timeout_s)
            for share in shares
        ]
        done = [future.result(timeout=timeout_s) for future in futures]
    rows = [row for share, _ in done for row in share]
    return [StreamResult(**row) for row in rows], sum(cpu for _, cpu in done)


def summary(
    transport: str, streams: int, results: list[StreamResult], engine_tps: float, answer: int
) -> dict[str, Any]:
    """One row: the median stream's delivered rate, its share of the engine's, and checks."""
    rates = [r.rate for r in results]
    rate = median(rates)
    return {
        "transport": transport,
        "streams": streams,
        "median_tok_s": rate,
        "median_share": rate / engine_tps,
        "min_tok_s": min(rates),
        # From the first delta on: what the stream carried once its answer had started.
        "median_streaming_tok_s": median([r.streaming_rate for r in results]),
        "median_ttft_s": median([r.first_delta - r.sent for r in results if r.first_delta]),
        # Opening every stream, before any create: the median stream's and the slowest's.
        "median_open_s": median([r.open_s for r in results]),
        "max_open_s": max(r.open_s for r in results),
        "total_tok_s": sum(r.tokens for r in results)
        / max(max(r.end for r in results) - min(r.sent for r in results), 1e-9),
        "messages_per_stream": median([float(r.messages) for r in results]),
        "deltas_per_stream": median([float(r.deltas) for r in results]),
        "correct": sum(r.correct(answer) for r in results),
    }


def settings_for(tokens_per_second: float, answer_tokens: int) -> ServerSettings:
    """The server: a sim engine at ``tokens_per_second`` answering ``answer_tokens`` at once."""
    return ServerSettings(
        tokens_per_second=tokens_per_second,
        ttft_ms=0.0,
        tool_rounds=0,
        answer_tokens=answer_tokens,
    )


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every transport at every stream count, on one server process."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        settings = settings_for(args.tokens_per_second, args.answer_tokens)
        with ServerProcess(settings, Path(tmp), "saturation") as server:
            address = server.address
            assert address is not None
            for streams in args.streams:
                for transport in args.transports:
                    server_cpu = server.cpu_seconds()
                    results, client_cpu = measure(
                        address, transport, streams, args.client_processes, args.timeout
                    )
                    row = summary(
                        transport, streams, results, args.tokens_per_second, args.answer_tokens
                    )
                    row["server_cpu_s"] = server.cpu_seconds() - server_cpu
                    row["client_cpu_s"] = client_cpu
                    rows.append(row)
                    print(_line(row), flush=True)
    return rows


def _line(row: dict[str, Any]) -> str:
    return (
        f"N={row['streams']:<4} {row['transport']:<16} median {row['median_tok_s']:7.0f} tok/s "
        f"({row['median_share'] * 100:5.1f}%), min {row['min_tok_s']:6.0f}, streaming "
        f"{row['median_streaming_tok_s']:5.0f}, TTFT {row['median_ttft_s'] * 1000:5.0f} ms, open "
        f"{row['median_open_s'] * 1000:4.0f}/{row['max_open_s'] * 1000:4.0f} ms, total "
        f"{row['total_tok_s'] / 1000:6.1f}k tok/s, {row['messages_per_stream']:6.0f} msgs/stream, "
        f"{row['correct']}/{row['streams']} correct, CPU s server {row['server_cpu_s']:.1f} "
        f"client {row['client_cpu_s']:.1f}"
    )


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=_ints, default=[50, 100, 200])
    parser.add_argument(
        "--transports",
        type=lambda t: t.split(","),
        default=list(TRANSPORTS),
        help="of " + ", ".join(TRANSPORTS),
    )
    parser.add_argument("--tokens-per-second", type=float, default=1000.0)
    parser.add_argument("--answer-tokens", type=int, default=2000)
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)
    unknown = set(args.transports) - set(TRANSPORTS)
    if unknown:
        parser.error(f"--transports: unknown {sorted(unknown)}, expected of {list(TRANSPORTS)}")
    rows = run(args)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    failed = [r for r in rows if r["correct"] != r["streams"]]
    with contextlib.suppress(BrokenPipeError):
        for row in failed:
            print(f"incorrect streams: {_line(row)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
