"""Round trip of one client event on each stream transport: the latency of a hop, alone.

A client sends an event the session answers at once without any engine work (a
``response.append`` for a response the stream does not have, answered with an ``error``
event), and waits for that answer; the time between is two transport hops plus the session's
handling, the same on both transports. Connect uses a stock grpc.aio stub, WebSocket mode the
``websockets`` library, each on one stream opened once, against one ``bidi-responses serve``
process. The payload is a function-call output of ``--output-chars`` characters, so the size
of what goes up can be varied.

``--idle-ms`` leaves the stream idle that long before each round, as an agent's stream is
while its tool runs: a round after a pause wakes threads and cores that went to sleep, on both
ends, and costs several times a round sent back to back. grpc.aio has more threads to wake
than an event loop reading its own socket.

This is the part of a steer's acknowledgement, and of a small turn's overhead, that the
transport decides: grpc.aio hands each message between grpc's own threads and the event loop
on both ends, where a WebSocket frame is read and written by the event loop itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import orjson
import websockets
from bidi_responses.codec import item_to_pb
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc

from .clients import ServerAddress
from .run import ServerProcess, ServerSettings
from .stats import median, percentile

__all__ = ["main", "measure"]

TRANSPORTS = ("grpc_connect", "websocket")


def _append(output_chars: int) -> dict[str, Any]:
    """The event sent: tool output for a response the stream does not have."""
    return {
        "type": "response.append",
        "response_id": "resp_not_on_this_stream",
        "input": [
            {"type": "function_call_output", "call_id": "call_1", "output": "x" * output_chars}
        ],
    }


async def _grpc_rounds(
    address: ServerAddress, rounds: int, output_chars: int, idle_s: float
) -> list[float]:
    event = _append(output_chars)
    request = pb.ConnectRequest(
        response_append=pb.ResponseAppend(
            response_id=event["response_id"], input=[item_to_pb(i) for i in event["input"]]
        )
    )
    times: list[float] = []
    async with grpc.aio.insecure_channel(f"{address.host}:{address.grpc_port}") as channel:
        call = pb_grpc.ResponsesServiceStub(channel).Connect()
        for _ in range(rounds):
            await _idle(idle_s)
            started = time.perf_counter()
            await call.write(request)
            answer = await call.read()
            times.append((time.perf_counter() - started) * 1000)
            if not isinstance(answer, pb.ConnectResponse) or answer.WhichOneof("event") != "error":
                raise RuntimeError(f"expected an error event, got {answer!r}")
        await call.done_writing()
    return times


async def _ws_rounds(
    address: ServerAddress, rounds: int, output_chars: int, idle_s: float
) -> list[float]:
    text = orjson.dumps(_append(output_chars)).decode()
    url = f"ws://{address.host}:{address.http_port}/v1/responses"
    times: list[float] = []
    async with websockets.connect(url, compression=None, max_size=None) as ws:
        for _ in range(rounds):
            await _idle(idle_s)
            started = time.perf_counter()
            await ws.send(text)
            answer = orjson.loads(await ws.recv())
            times.append((time.perf_counter() - started) * 1000)
            if answer.get("type") != "error":
                raise RuntimeError(f"expected an error event, got {answer!r}")
    return times


async def _idle(seconds: float) -> None:
    """The pause before a round (none when 0: rounds back to back)."""
    if seconds > 0:
        await asyncio.sleep(seconds)


async def measure(
    address: ServerAddress, transport: str, rounds: int, output_chars: int, idle_ms: float = 0.0
) -> list[float]:
    """Round-trip times (ms) of ``rounds`` events on one stream of ``transport``, each sent
    ``idle_ms`` after the previous answer."""
    idle_s = idle_ms / 1000
    if transport == "grpc_connect":
        return await _grpc_rounds(address, rounds, output_chars, idle_s)
    if transport == "websocket":
        return await _ws_rounds(address, rounds, output_chars, idle_s)
    raise ValueError(f"unknown transport {transport!r} (one of {', '.join(TRANSPORTS)})")


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Alternating transports, ``repeats`` times per pause, on one server process."""
    rows: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        ServerProcess(ServerSettings(), Path(tmp), "roundtrip") as server,
    ):
        address = server.address
        assert address is not None
        for idle_ms in args.idle_ms:
            times: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
            for _ in range(args.repeats):
                for transport in TRANSPORTS:
                    measured = asyncio.run(
                        measure(
                            address,
                            transport,
                            args.rounds + args.warmup,
                            args.output_chars,
                            idle_ms,
                        )
                    )
                    times[transport].extend(measured[args.warmup :])
            for transport, values in times.items():
                rows.append(
                    {
                        "transport": transport,
                        "output_chars": args.output_chars,
                        "idle_ms": idle_ms,
                        "rounds": len(values),
                        "p50_ms": median(values),
                        "p10_ms": percentile(values, 10),
                        "p90_ms": percentile(values, 90),
                    }
                )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300, help="measured rounds per repeat")
    parser.add_argument("--warmup", type=int, default=30, help="rounds left out per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output-chars", type=int, default=3000)
    parser.add_argument(
        "--idle-ms",
        type=lambda text: [float(part) for part in text.split(",") if part],
        default=[0.0, 20.0],
        help="pauses before each round, comma-separated (0: back to back)",
    )
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)
    rows = run(args)
    for row in rows:
        print(
            f"{row['transport']:<13} {row['output_chars']} chars up, {row['idle_ms']:g} ms idle "
            "before each: round trip p50 "
            f"{row['p50_ms']:.3f} ms [p10 {row['p10_ms']:.3f} - p90 {row['p90_ms']:.3f}] over "
            f"{row['rounds']} rounds"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
