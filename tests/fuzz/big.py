"""Fuzz with huge inputs mixed with small streams: no request may stall or break the others.

``python -m tests.fuzz.big --inputs 40`` (``make fuzz-big``) starts ``bidi-responses serve``
as a subprocess and, while small agents keep taking turns on every transport (gRPC Connect,
WebSocket mode, HTTP), sends hypothesis-drawn huge inputs: about 10 MB of one character (the
tokenizer's worst case), of prose, of digits, of whitespace or of random text, placed in
``instructions``, a user message, a tool output or a tool's description, sized just under or
over the per-item limit, over every transport. It prints one table like ``make fuzz``'s (the
big inputs per transport, then the small turns), and exits 1 on any hang, 5xx, gRPC
UNKNOWN/INTERNAL or dropped connection, a traceback in the server's log, or small streams that
completed no turn while the big inputs were being processed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import orjson
import websockets
from bidi_responses.bench.fairness import unlimited_channel
from bidi_responses.bench.servers import serve_command
from bidi_responses.codec import EventDecoder, params_to_pb, steer_to_pb
from bidi_responses.v1 import responses_pb2 as pb
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.fuzz.run import (
    BAD,
    SERVICE,
    TURN_ENDS,
    VALID,
    FuzzServer,
    _event_outcome,
    _status_outcome,
    log_counts,
    report,
    still_serves,
)

# A big input gets this long to be answered (10 MB is checked, tokenized and echoed back in a
# few seconds on one core); a small turn gets the usual deadline.
BIG_DEADLINE_S = 120.0
SMALL_DEADLINE_S = 10.0
TRANSPORTS = ("http", "websocket", "grpc Connect", "grpc CreateResponse")
PLACES = ("instructions", "message", "tool_output", "tool_description", "steer")
# A steer exists only on a stream: drawn for another transport, the text goes in a message.
STEERABLE = ("websocket", "grpc Connect")
ITEM_LIMIT = 10_485_760  # the default limits.max_item_chars
SHELL = {
    "type": "function",
    "name": "exec_command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}


class BigFuzzServer(FuzzServer):
    """``make fuzz``'s server, with a prefill that costs nothing: the simulated engine would
    otherwise model minutes of prefill for tens of millions of prompt tokens, and the run
    would measure the model, not the API."""

    def start(self) -> None:
        config = self.data_dir / "server.toml"
        config.write_text(
            '[models."sim-model".sim]\n'
            "tokens_per_second = 1000000.0\n"
            "ttft_ms = 0.0\n"
            "prefill_tokens_per_second = 1e15\n"
            "tool_rounds = 1\n",
            encoding="utf-8",
        )
        command = serve_command(
            config,
            grpc_port=self.grpc_port,
            http_port=self.http_port,
            data_dir=self.data_dir / "data",
        )
        log = open(self.log_path, "wb")  # noqa: SIM115 (the child writes it until the end)
        self.process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()
        deadline = time.monotonic() + 60
        while b"listening" not in self.log_path.read_bytes():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start:\n{self.log_path.read_text()}")
            time.sleep(0.05)  # polling a file the child writes; no event to wait on


@dataclass(frozen=True)
class BigInput:
    """One huge request: where the text goes, what it is made of, how long, which transport."""

    transport: str
    place: str
    text: str

    def describe(self) -> str:
        """One line naming the input (its text abbreviated)."""
        return f"{self.transport}, {self.place}, {len(self.text)} x {self.text[:8]!r}..."

    def body(self) -> dict[str, Any]:
        """The create's JSON body."""
        body: dict[str, Any] = {"model": "sim-model", "store": False, "input": "go"}
        if self.place == "instructions":
            body["instructions"] = self.text
        elif self.place == "message":
            body["input"] = [{"type": "message", "role": "user", "content": self.text}]
        elif self.place == "tool_output":
            call = {"type": "function_call", "call_id": "c1", "name": "exec_command"}
            body["tools"] = [SHELL]
            body["input"] = [
                {**call, "arguments": '{"cmd": "ls"}'},
                {"type": "function_call_output", "call_id": "c1", "output": self.text},
            ]
        else:
            body["tools"] = [{**SHELL, "description": self.text}]
        return body


@st.composite
def big_inputs(draw: st.DrawFn, chars: int) -> BigInput:
    """A huge input of about ``chars`` characters (sometimes just over the item limit)."""
    seed = draw(
        st.sampled_from(["a", "!", " ", "\n", "7", "é", "漢"])
        | st.sampled_from(["The quick brown fox jumps over the lazy dog 1234. "])
        | st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=8)
    )
    size = draw(
        st.sampled_from([chars, chars - 1, ITEM_LIMIT + 1]) if chars > 1e6 else st.just(chars)
    )
    text = (seed * (size // len(seed) + 1))[:size]
    transport, place = draw(st.sampled_from(TRANSPORTS)), draw(st.sampled_from(PLACES))
    if place == "steer" and transport not in STEERABLE:
        place = "message"
    return BigInput(transport, place, text)


# -- senders -----------------------------------------------------------------------------------


async def send_big(server: FuzzServer, big: BigInput) -> str:
    """Send one huge input on its own connection; its outcome."""
    body = big.body()
    try:
        async with asyncio.timeout(BIG_DEADLINE_S):
            if big.place == "steer":
                return await _send_big_steer(server, big)
            if big.transport == "http":
                async with httpx.AsyncClient(timeout=BIG_DEADLINE_S) as http:
                    reply = await http.post(
                        f"http://127.0.0.1:{server.http_port}/v1/responses", json=body
                    )
                if reply.status_code >= 500 or b'"server_error"' in reply.content:
                    return "5xx"
                return "4xx" if reply.status_code >= 400 else "ok"
            if big.transport == "websocket":
                url = f"ws://127.0.0.1:{server.http_port}/v1/responses"
                async with websockets.connect(url, max_size=None) as ws:
                    await ws.send(orjson.dumps({"type": "response.create", **body}).decode())
                    while True:
                        event = orjson.loads(await ws.recv())
                        if event.get("type") in TURN_ENDS:
                            return _event_outcome(event)
            params = params_to_pb(body)
            decoder = EventDecoder()
            async with unlimited_channel(server.grpc_port) as channel:
                if big.transport == "grpc CreateResponse":
                    create: grpc.aio.UnaryStreamMultiCallable[bytes, pb.CreateResponseResponse]
                    create = channel.unary_stream(
                        f"{SERVICE}/CreateResponse",
                        request_serializer=None,
                        response_deserializer=pb.CreateResponseResponse.FromString,
                    )
                    raw = pb.CreateResponseRequest(params=params).SerializeToString()
                    outcome = "dropped"
                    # Read to the call's status, as a client does.
                    async for answer in create(raw):
                        event = decoder.event(answer.event)
                        if event.get("type") in TURN_ENDS:
                            outcome = _event_outcome(event)
                    return outcome
                connect: grpc.aio.StreamStreamMultiCallable[bytes, pb.ConnectResponse]
                connect = channel.stream_stream(
                    f"{SERVICE}/Connect",
                    request_serializer=None,
                    response_deserializer=pb.ConnectResponse.FromString,
                )
                call = connect()
                await call.write(pb.ConnectRequest(response_create=params).SerializeToString())
                while True:
                    message = await call.read()
                    if message is grpc.aio.EOF:
                        return "dropped"
                    assert isinstance(message, pb.ConnectResponse)
                    event = decoder.event(message)
                    if event.get("type") in TURN_ENDS:
                        await call.done_writing()
                        return _event_outcome(event)
    except TimeoutError:
        return "hang"
    except grpc.aio.AioRpcError as error:
        return _status_outcome(error)
    except (httpx.TransportError, websockets.ConnectionClosed):
        return "dropped"


_STEER_ENDS = frozenset({"response.steer.failed", "response.steer.accepted", "error"})


async def _send_big_steer(server: FuzzServer, big: BigInput) -> str:
    """A huge ``response.steer`` (for a response the stream does not have), then a small turn
    on the same stream: refused with ``response.steer.failed`` ("4xx") and the stream still
    serves, or what went wrong."""
    steer = {"type": "response.steer", "previous_response_id": "resp_none", "input": big.text}
    if big.transport == "websocket":
        url = f"ws://127.0.0.1:{server.http_port}/v1/responses"
        async with websockets.connect(url, max_size=None) as ws:
            await ws.send(orjson.dumps(steer).decode())
            answer = orjson.loads(await ws.recv())
            await ws.send(orjson.dumps({"type": "response.create", **VALID}).decode())
            while (event := orjson.loads(await ws.recv()))["type"] not in TURN_ENDS:
                pass
    else:
        decoder = EventDecoder()
        async with unlimited_channel(server.grpc_port) as channel:
            connect: grpc.aio.StreamStreamMultiCallable[bytes, pb.ConnectResponse]
            connect = channel.stream_stream(
                f"{SERVICE}/Connect",
                request_serializer=None,
                response_deserializer=pb.ConnectResponse.FromString,
            )
            call = connect()
            request = pb.ConnectRequest(response_steer=steer_to_pb("resp_none", big.text))
            await call.write(request.SerializeToString())
            message = await call.read()
            if not isinstance(message, pb.ConnectResponse):
                return "dropped"
            answer = decoder.event(message)
            create = pb.ConnectRequest(response_create=params_to_pb(VALID))
            await call.write(create.SerializeToString())
            while True:
                message = await call.read()
                if not isinstance(message, pb.ConnectResponse):
                    return "dropped"
                event = decoder.event(message)
                if event.get("type") in TURN_ENDS:
                    break
            await call.done_writing()
    if answer.get("type") not in _STEER_ENDS or _event_outcome(event) != "ok":
        return "5xx"  # no answer of a steer's kind, or the stream no longer serves
    return "ok" if answer["type"] == "response.steer.accepted" else "4xx"


async def small_agent(
    server: FuzzServer, transport: str, stop: asyncio.Event, counts: collections.Counter[str]
) -> None:
    """Small turns, one after another, until ``stop``; each outcome counted."""

    async def turn(send: Any) -> str:
        try:
            async with asyncio.timeout(SMALL_DEADLINE_S):
                return str(await send())
        except TimeoutError:
            return "hang"
        except grpc.aio.AioRpcError as error:
            return _status_outcome(error)
        except (httpx.TransportError, websockets.ConnectionClosed):
            return "dropped"

    if transport == "http":
        async with httpx.AsyncClient(timeout=SMALL_DEADLINE_S + 5) as http:

            async def post() -> str:
                reply = await http.post(
                    f"http://127.0.0.1:{server.http_port}/v1/responses", json=VALID
                )
                return "ok" if reply.status_code == 200 else "4xx"

            while not stop.is_set():
                counts[await turn(post)] += 1
        return
    if transport == "websocket":
        url = f"ws://127.0.0.1:{server.http_port}/v1/responses"
        async with websockets.connect(url) as ws:

            async def create() -> str:
                await ws.send(orjson.dumps({"type": "response.create", **VALID}).decode())
                while True:
                    event = orjson.loads(await ws.recv())
                    if event.get("type") in TURN_ENDS:
                        return _event_outcome(event)

            while not stop.is_set():
                counts[await turn(create)] += 1
        return
    async with unlimited_channel(server.grpc_port) as channel:
        connect: grpc.aio.StreamStreamMultiCallable[bytes, pb.ConnectResponse]
        connect = channel.stream_stream(
            f"{SERVICE}/Connect",
            request_serializer=None,
            response_deserializer=pb.ConnectResponse.FromString,
        )
        call = connect()
        decoder = EventDecoder()
        message = pb.ConnectRequest(response_create=params_to_pb(VALID)).SerializeToString()

        async def connect_turn() -> str:
            await call.write(message)
            while True:
                reply = await call.read()
                if reply is grpc.aio.EOF:
                    return "dropped"
                assert isinstance(reply, pb.ConnectResponse)
                event = decoder.event(reply)
                if event.get("type") in TURN_ENDS:
                    return _event_outcome(event)

        while not stop.is_set():
            counts[await turn(connect_turn)] += 1
        await call.done_writing()


# -- the run -----------------------------------------------------------------------------------


def draw_inputs(inputs: int, chars: int) -> list[BigInput]:
    """``inputs`` huge inputs drawn by hypothesis (generation only, no shrinking)."""
    drawn: list[BigInput] = []

    @settings(
        max_examples=inputs,
        phases=[Phase.generate],
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(big_inputs(chars))
    def collect(big: BigInput) -> None:
        drawn.append(big)

    collect()
    return drawn[:inputs]


async def _run(
    server: FuzzServer, bigs: list[BigInput], parallel: int
) -> tuple[dict[str, collections.Counter[str]], dict[str, Any]]:
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    small: dict[str, collections.Counter[str]] = {
        f"small {t}": collections.Counter() for t in ("grpc", "websocket", "http")
    }
    stop = asyncio.Event()
    agents = [
        asyncio.create_task(small_agent(server, transport.split()[1], stop, counter))
        for transport, counter in small.items()
    ]
    await asyncio.sleep(0)  # the agents open their streams first
    before = sum(sum(c.values()) for c in small.values())
    queue = list(bigs)
    gate = asyncio.Semaphore(parallel)

    failures: list[str] = []

    async def one(big: BigInput) -> None:
        async with gate:
            outcome = await send_big(server, big)
        counts[f"big {big.transport}"][outcome] += 1
        if outcome in BAD:
            failures.append(f"{outcome}: {big.describe()}")

    try:
        await asyncio.gather(*(one(big) for big in queue))
    finally:
        during = sum(sum(c.values()) for c in small.values()) - before
        stop.set()
        await asyncio.gather(*agents, return_exceptions=True)
    counts.update(small)
    state: dict[str, Any] = {"small_turns_during": during, "failures": failures}
    return counts, state


def run_big_fuzz(
    inputs: int, workdir: Path, chars: int = 10_000_000, parallel: int = 2
) -> tuple[dict[str, collections.Counter[str]], dict[str, Any]]:
    """Huge inputs mixed with small streams on a fresh server; counts and the server's state."""
    bigs = draw_inputs(inputs, chars)
    server = BigFuzzServer(workdir)
    server.start()
    try:
        counts, state = asyncio.run(_run(server, bigs, parallel))
        state["alive"] = server.alive
        state["serves"] = asyncio.run(still_serves(server)) if server.alive else {}
    finally:
        server.stop()
    state.update(log_counts(server.log_path.read_text(errors="replace")))
    return counts, state


def main(argv: list[str] | None = None) -> int:
    """Entry point: the table; exit 1 unless the run is clean."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--inputs", type=int, default=40, help="huge inputs (40)")
    parser.add_argument("--chars", type=int, default=10_000_000, help="their size (10 M)")
    parser.add_argument("--parallel", type=int, default=2, help="huge inputs at once (2)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fuzz-big-") as workdir:
        counts, state = run_big_fuzz(args.inputs, Path(workdir), args.chars, args.parallel)
    table, clean = report(counts, state)
    during = state["small_turns_during"]
    clean = clean and during > 0
    print(table)
    print(f"small turns completed while huge inputs were processed: {during}")
    for failure in state["failures"]:
        print(failure)
    print(f"{'clean' if clean else 'FAILED'} in {time.monotonic() - started:.0f} s")
    bad = [c for c in BAD if any(counter.get(c, 0) for counter in counts.values())]
    if bad:
        print("bad outcomes:", ", ".join(bad))
    return 0 if clean else 1


if __name__ == "__main__":
    raise SystemExit(main())
