"""Fuzz the compressed paths: what the server holds of a message is its inflated size.

``python -m tests.fuzz.compressed --inputs 200`` (part of ``make fuzz``) starts ``bidi-responses
serve`` with WebSocket compression on, a 4 MiB message limit and a 16 MiB request budget, and
sends hypothesis-drawn compressed inputs: WebSocket permessage-deflate messages (1 to 4
fragments), gRPC messages compressed with gzip or deflate, and HTTP bodies with a
``Content-Encoding``; of one repeated character (a thousandfold ratio), digits or random text;
sized far under, just under, just over or far over the limit; up to 6 copies at once. Every
input must end with an answer or a clear refusal (an error event, a 4xx, a close code with a
reason, RESOURCE_EXHAUSTED / INVALID_ARGUMENT), never a hang, a 5xx, UNKNOWN/INTERNAL or a
connection dropped without a code; the server must still serve every transport afterwards,
log no ERROR or traceback, and its peak RSS must stay within the budget's reach.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gzip
import random
import resource
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import orjson
import websockets
from bidi_responses.codec import EventDecoder, params_to_pb
from bidi_responses.v1 import responses_pb2 as pb
from hypothesis import strategies as st

from tests.faults.descriptor_flood import Server, other_client, serve
from tests.fuzz.run import (
    BAD,
    SERVICE,
    TURN_ENDS,
    Loop,
    _event_outcome,
    _fuzz,
    _status_outcome,
    log_counts,
    report,
)

LIMIT = 4 * 1024 * 1024
BUDGET = 16 * 1024 * 1024
DEADLINE_S = 20.0
TRANSPORTS = ("websocket", "grpc gzip", "grpc deflate", "http")
ENCODINGS = ("gzip", "deflate", "br", "identity", "gzip, gzip", "x-unknown")


@dataclass(frozen=True, slots=True)
class Input:
    transport: str
    size: int
    content: str
    shape: str
    copies: int
    fragments: int
    encoding: str
    seed: int


@st.composite
def compressed_inputs(draw: st.DrawFn) -> Input:
    sizes = (1_000, LIMIT - 1024, LIMIT + 1, 3 * LIMIT)
    return Input(
        transport=draw(st.sampled_from(TRANSPORTS)),
        size=draw(st.sampled_from(sizes) | st.integers(1, 3 * LIMIT)),
        content=draw(st.sampled_from(["one character", "digits", "random"])),
        shape=draw(st.sampled_from(["create", "create", "not json", "binary"])),
        copies=draw(st.integers(1, 6)),
        fragments=draw(st.integers(1, 4)),
        encoding=draw(st.sampled_from(ENCODINGS)),
        seed=draw(st.integers(0, 2**32)),
    )


def _text(item: Input) -> str:
    if item.content == "one character":
        return "a" * item.size
    if item.content == "digits":
        return ("0123456789" * (item.size // 10 + 1))[: item.size]
    rng = random.Random(item.seed)
    return rng.randbytes(item.size // 2 + 1).hex()[: item.size]


def _payload(item: Input) -> bytes:
    """The message as the application would read it, before compression."""
    text = _text(item)
    if item.shape == "create":
        body = {"model": "sim-model", "input": "hi", "store": False, "instructions": text}
        return orjson.dumps(body)
    if item.shape == "not json":
        return b'{"type": "response.create", "instructions": "' + text.encode()
    return random.Random(item.seed).randbytes(min(item.size, 1 << 16)) + text.encode()


async def _websocket(server: Server, item: Input, payload: bytes) -> str:
    if item.shape == "create":
        event = orjson.loads(payload)
        payload = orjson.dumps({"type": "response.create", **event})
    text = payload.decode(errors="replace")
    step = max(len(text) // item.fragments, 1)
    pieces = [text[i : i + step] for i in range(0, len(text), step)] or [""]
    try:
        async with (
            asyncio.timeout(DEADLINE_S),
            websockets.connect(
                f"ws://127.0.0.1:{server.http_port}/v1/responses",
                compression="deflate",
                max_size=None,
            ) as ws,
        ):
            await ws.send(pieces if len(pieces) > 1 else pieces[0])
            while True:
                event = orjson.loads(await ws.recv())
                if event.get("type") in TURN_ENDS:
                    return _event_outcome(event)
    except TimeoutError:
        return "hang"
    except websockets.ConnectionClosed as closed:
        if closed.rcvd is None:
            return "dropped"
        code = closed.rcvd.code
        return "5xx" if code == 1011 else "4xx" if closed.rcvd.reason else "dropped"


async def _grpc(server: Server, item: Input, payload: bytes) -> str:
    if item.shape == "create":
        message = pb.ConnectRequest(response_create=params_to_pb(orjson.loads(payload)))
        raw = message.SerializeToString()
    else:
        raw = payload
    compression = (
        grpc.Compression.Gzip if item.transport == "grpc gzip" else grpc.Compression.Deflate
    )
    decoder = EventDecoder()
    try:
        async with (
            asyncio.timeout(DEADLINE_S),
            grpc.aio.insecure_channel(
                f"127.0.0.1:{server.grpc_port}",
                compression=compression,
                options=[("grpc.max_receive_message_length", -1)],
            ) as channel,
        ):
            connect: grpc.aio.StreamStreamMultiCallable[bytes, pb.ConnectResponse]
            connect = channel.stream_stream(
                f"{SERVICE}/Connect",
                request_serializer=None,
                response_deserializer=pb.ConnectResponse.FromString,
            )
            # One message, then the half-close: the call ends by itself after its turn (a
            # client's cancel is another family's subject).
            outcome = "ok"
            async for reply in connect(iter([raw])):
                event = decoder.event(reply)
                if event.get("type") in TURN_ENDS:
                    outcome = _event_outcome(event)
            return outcome
    except TimeoutError:
        return "hang"
    except grpc.aio.AioRpcError as error:
        return _status_outcome(error)


async def _http(server: Server, item: Input, payload: bytes) -> str:
    if item.encoding.startswith("gzip"):
        body = gzip.compress(payload)
    elif item.encoding == "deflate":
        body = zlib.compress(payload)
    else:
        body = payload
    headers = {"content-type": "application/json", "content-encoding": item.encoding}
    try:
        async with (
            asyncio.timeout(DEADLINE_S),
            httpx.AsyncClient(timeout=DEADLINE_S) as http,
        ):
            reply = await http.post(
                f"http://127.0.0.1:{server.http_port}/v1/responses", content=body, headers=headers
            )
    except TimeoutError:
        return "hang"
    except httpx.TransportError:
        return "dropped"
    if reply.status_code >= 500:
        return "5xx"
    return "4xx" if reply.status_code >= 400 else "ok"


async def _one(server: Server, item: Input) -> list[str]:
    payload = _payload(item)
    send = (
        _websocket
        if item.transport == "websocket"
        else _http
        if item.transport == "http"
        else _grpc
    )
    return list(await asyncio.gather(*(send(server, item, payload) for _ in range(item.copies))))


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def run_compressed_fuzz(
    inputs: int, workdir: Path
) -> tuple[dict[str, collections.Counter[str]], dict[str, Any]]:
    """Fuzz a fresh server with ``inputs`` drawn inputs; returns counts and its state."""
    loop = Loop()
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    state: dict[str, Any] = {}
    stack = contextlib.AsyncExitStack()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limits: dict[str, int | bool] = {
        "websocket_compression": True,
        "max_message_bytes": LIMIT,
        "max_inflight_request_bytes": BUDGET,
    }
    try:
        server = loop.run(stack.enter_async_context(serve(workdir, hard, limits)))
        state["rss_before"] = _peak_rss(server.process.pid)

        def act(item: Input) -> None:
            for outcome in loop.run(_one(server, item)):
                counts[item.transport][outcome] += 1

        _fuzz(inputs, compressed_inputs(), act)
        state["alive"] = server.process.returncode is None
        served = loop.run(other_client(server)) if state["alive"] else None
        state["serves"] = (
            {"http": served.http, "websocket": served.websocket, "grpc": served.grpc}
            if served is not None
            else {}
        )
        state["rss_peak"] = _peak_rss(server.process.pid)
    finally:
        loop.run(stack.aclose())
        loop.close()
    log = (workdir / "server.log").read_text(errors="replace")
    state.update(log_counts(log))
    at = log.find(" ERROR ")
    state["first_error"] = log[max(at - 100, 0) : at + 1500] if at >= 0 else ""
    return counts, state


def clean_memory(state: dict[str, Any]) -> bool:
    """The peak grew by no more than the budget allows, with headroom for the rest (the
    budget counts 4 copies a byte, so a 16 MiB budget holds little)."""
    return bool(state["rss_peak"] - state["rss_before"] < 256 * 1024 * 1024)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--inputs", type=int, default=200)
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fuzz-compressed-") as workdir:
        counts, state = run_compressed_fuzz(args.inputs, Path(workdir))
    table, clean = report(counts, state)
    growth = (state["rss_peak"] - state["rss_before"]) / 2**20
    print(table)
    print(f"server peak RSS +{growth:.0f} MiB over the run (budget {BUDGET / 2**20:.0f} MiB)")
    clean = clean and clean_memory(state)
    print(f"{'clean' if clean else 'FAILED'} in {time.monotonic() - started:.0f} s")
    return 0 if clean else 1


__all__ = ["BAD", "clean_memory", "run_compressed_fuzz"]

if __name__ == "__main__":
    sys.exit(main())
