"""Fuzz every transport of a real server with hypothesis-generated hostile input.

``python -m tests.fuzz.run --inputs 10000`` (``make fuzz``) starts ``bidi-responses serve`` as
a subprocess, sends the inputs over gRPC (typed messages and raw-framed bytes, on Connect and
the stateless call), HTTP and WebSocket, and prints one table: per transport, how many inputs
were answered, refused with a 4xx, left hanging (no answer within the deadline), answered
5xx, ended with gRPC UNKNOWN/INTERNAL, or dropped the connection; then whether the server
process is alive and still serves a valid request on every transport. Exit status 1 if any
count that must be 0 is not.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import httpx
import orjson
import websockets
from bidi_responses.bench.ports import free_port
from bidi_responses.codec import EventDecoder, params_to_pb
from bidi_responses.v1 import responses_pb2 as pb
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.fuzz.strategies import by_id_requests, client_events, connect_messages, create_bodies

T = TypeVar("T")
DEADLINE_S = 10.0
TURN_ENDS = frozenset(
    {"response.completed", "response.failed", "response.incomplete", "error", "response.done"}
)
BAD = ("hang", "5xx", "unknown_internal", "dropped")
SERVICE = "/bidi_responses.v1.ResponsesService"
VALID = {"model": "sim-model", "input": "hi", "store": False}


@dataclass
class FuzzServer:
    """``bidi-responses serve`` in a subprocess, its output kept in a file."""

    data_dir: Path
    grpc_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    def start(self) -> None:
        log = open(self.log_path, "wb")  # noqa: SIM115 (the child writes it until the end)
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bidi_responses.server.cli",
                "serve",
                "--grpc-port",
                str(self.grpc_port),
                "--http-port",
                str(self.http_port),
                "--data-dir",
                str(self.data_dir / "data"),
                "--sim-tps",
                "1000000",
                "--sim-ttft-ms",
                "0",
                "--sim-tool-rounds",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + 60
        while b"listening" not in self.log_path.read_bytes():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start:\n{self.log_path.read_text()}")
            time.sleep(0.05)  # polling a file the child writes; no event to wait on

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Loop:
    """An event loop on its own thread; hypothesis runs in the caller's thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


def _event_outcome(event: dict[str, Any]) -> str:
    if event.get("type") == "error":
        status = event.get("status")
        code = (event.get("error") or {}).get("code") if "error" in event else event.get("code")
        if (isinstance(status, int) and status >= 500) or code == "server_error":
            return "5xx"
        return "4xx"
    if event.get("type") == "response.failed":
        return "5xx"
    return "ok"


# -- HTTP --------------------------------------------------------------------------------------


def _dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(value).encode()


async def http_one(client: httpx.AsyncClient, raw: bytes) -> str:
    try:
        async with asyncio.timeout(DEADLINE_S):
            reply = await client.post("/v1/responses", content=raw)
    except TimeoutError:
        return "hang"
    except httpx.TransportError:
        return "dropped"
    if reply.status_code >= 500 or b'"server_error"' in reply.content:
        return "5xx"
    return "4xx" if reply.status_code >= 400 else "ok"


# -- WebSocket ---------------------------------------------------------------------------------


class WsFuzzer:
    def __init__(self, port: int) -> None:
        self.url = f"ws://127.0.0.1:{port}/v1/responses"
        self.ws: websockets.ClientConnection | None = None

    async def one(self, frame: str) -> str:
        if self.ws is None:
            self.ws = await websockets.connect(self.url, max_size=None)
        outcome = "ok"
        try:
            async with asyncio.timeout(DEADLINE_S):
                await self.ws.send(frame)
                while True:
                    event = orjson.loads(await self.ws.recv())
                    if event.get("type") in TURN_ENDS:
                        return _event_outcome(event)
        except TimeoutError:
            outcome = "hang"
        except websockets.ConnectionClosed:
            outcome = "dropped"
        await self.reset()
        return outcome

    async def reset(self) -> None:
        if self.ws is not None:
            await self.ws.close()
            self.ws = None


# -- gRPC --------------------------------------------------------------------------------------


class GrpcFuzzer:
    """Raw-framed messages on a Connect stream (renewed every ``per_stream`` messages) and
    on the stateless call."""

    def __init__(self, port: int, per_stream: int = 50) -> None:
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.per_stream = per_stream
        self.sent = 0
        self.outbox: asyncio.Queue[bytes | None] | None = None
        self.events: asyncio.Queue[dict[str, Any] | BaseException | None] | None = None
        self.call: Any = None
        self.reader: asyncio.Task[None] | None = None

    async def _open(self) -> None:
        outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        events: asyncio.Queue[dict[str, Any] | BaseException | None] = asyncio.Queue()

        async def requests() -> AsyncIterator[bytes]:
            while (message := await outbox.get()) is not None:
                yield message

        connect: grpc.aio.StreamStreamMultiCallable[bytes, pb.ConnectResponse]
        connect = self.channel.stream_stream(
            f"{SERVICE}/Connect",
            request_serializer=None,
            response_deserializer=pb.ConnectResponse.FromString,
        )
        self.call = connect(requests())
        decoder = EventDecoder()
        call = self.call

        async def read() -> None:
            try:
                async for reply in call:
                    await events.put(decoder.event(reply))
                await events.put(None)
            except BaseException as exc:
                await events.put(exc)

        self.outbox, self.events = outbox, events
        self.reader = asyncio.ensure_future(read())
        self.sent = 0

    async def close_stream(self) -> str:
        """Half-close; the call must end with status OK."""
        if self.outbox is None or self.events is None:
            return "ok"
        await self.outbox.put(None)
        outcome = "ok"
        try:
            async with asyncio.timeout(DEADLINE_S):
                while (event := await self.events.get()) is not None:
                    if isinstance(event, BaseException):
                        outcome = _status_outcome(event)
                        break
        except TimeoutError:
            outcome = "hang"
        if self.reader is not None:
            self.reader.cancel()
        self.outbox = self.events = None
        return outcome

    async def connect_one(self, message: bytes) -> str:
        if self.outbox is None:
            await self._open()
        assert self.outbox is not None and self.events is not None
        await self.outbox.put(message)
        self.sent += 1
        outcome = "ok"
        try:
            async with asyncio.timeout(DEADLINE_S):
                while True:
                    event = await self.events.get()
                    if event is None:
                        outcome = "dropped"
                        break
                    if isinstance(event, BaseException):
                        outcome = _status_outcome(event)
                        break
                    if event.get("type") in TURN_ENDS:
                        outcome = _event_outcome(event)
                        break
        except TimeoutError:
            outcome = "hang"
        if (outcome != "ok" and outcome != "4xx") or self.sent >= self.per_stream:
            closing = await self.close_stream()
            if outcome in ("ok", "4xx"):
                outcome = closing
        return outcome

    async def stateless_one(self, message: bytes) -> str:
        create: grpc.aio.UnaryStreamMultiCallable[bytes, pb.CreateResponseResponse]
        create = self.channel.unary_stream(
            f"{SERVICE}/CreateResponse",
            request_serializer=None,
            response_deserializer=pb.CreateResponseResponse.FromString,
        )
        decoder = EventDecoder()
        outcome = "ok"
        try:
            async with asyncio.timeout(DEADLINE_S):
                async for reply in create(message):
                    event = decoder.event(reply.event)
                    if event.get("type") in TURN_ENDS:
                        outcome = _event_outcome(event)
        except TimeoutError:
            return "hang"
        except grpc.aio.AioRpcError as error:
            return _status_outcome(error)
        return outcome

    async def close(self) -> None:
        await self.close_stream()
        await self.channel.close()


def _status_outcome(error: BaseException) -> str:
    if isinstance(error, grpc.aio.AioRpcError):
        code = error.code()
        if code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL):
            return "unknown_internal"
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "metadata" in (error.details() or ""):
            # The status itself was too large for the client to read (an echo unbounded).
            return "unknown_internal"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return "hang"
        if code == grpc.StatusCode.UNAVAILABLE:
            return "dropped"
        return "4xx"
    return "dropped"


# -- by-id calls: GetResponse & co. over gRPC, and their HTTP routes --------------------------

_BY_ID_REQUESTS: dict[str, tuple[type[Any], str]] = {
    "GetResponse": (pb.GetResponseRequest, "response_id"),
    "DeleteResponse": (pb.DeleteResponseRequest, "response_id"),
    "ListInputItems": (pb.ListInputItemsRequest, "response_id"),
    "CancelResponse": (pb.CancelResponseRequest, "response_id"),
    "GetModel": (pb.GetModelRequest, "model"),
    "StreamResponse": (pb.StreamResponseRequest, "response_id"),
}
_BY_ID_ROUTES = {
    "GetResponse": ("GET", "/v1/responses/{}"),
    "DeleteResponse": ("DELETE", "/v1/responses/{}"),
    "ListInputItems": ("GET", "/v1/responses/{}/input_items"),
    "CancelResponse": ("POST", "/v1/responses/{}/cancel"),
    "GetModel": ("GET", "/v1/models/{}"),
    "StreamResponse": ("GET", "/v1/responses/{}?stream=true"),
}


async def grpc_by_id(channel: grpc.aio.Channel, call: str, ident: str) -> str:
    """One by-id call with a stock reply decoder; a 4xx-like status is the expected answer."""
    request_class, field_name = _BY_ID_REQUESTS[call]
    data = request_class(**{field_name: ident}).SerializeToString()
    try:
        async with asyncio.timeout(DEADLINE_S):
            if call == "StreamResponse":
                stream: grpc.aio.UnaryStreamMultiCallable[bytes, bytes]
                stream = channel.unary_stream(f"{SERVICE}/{call}", request_serializer=None)
                async for _ in stream(data):
                    pass
            else:
                unary: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]
                unary = channel.unary_unary(f"{SERVICE}/{call}", request_serializer=None)
                await unary(data)
    except TimeoutError:
        return "hang"
    except grpc.aio.AioRpcError as error:
        return _status_outcome(error)
    return "ok"


async def http_by_id(client: httpx.AsyncClient, call: str, ident: str) -> str:
    method, template = _BY_ID_ROUTES[call]
    path = template.format(urllib.parse.quote(ident, safe=""))
    try:
        async with asyncio.timeout(DEADLINE_S):
            reply = await client.request(method, path)
    except TimeoutError:
        return "hang"
    except httpx.TransportError:
        return "dropped"
    if reply.status_code >= 500 or b'"server_error"' in reply.content:
        return "5xx"
    return "4xx" if reply.status_code >= 400 else "ok"


# -- the run -----------------------------------------------------------------------------------


def _fuzz(examples: int, strategy: st.SearchStrategy[Any], act: Any) -> None:
    """Draw ``examples`` inputs with hypothesis and hand each to ``act`` (no shrinking: every
    outcome is recorded, none fails the run early)."""

    @settings(
        max_examples=examples,
        phases=[Phase.generate],
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def run(data: st.DataObject) -> None:
        act(data.draw(strategy))

    run()


async def still_serves(server: FuzzServer) -> dict[str, bool]:
    """One valid request per transport after the fuzzing."""
    result: dict[str, bool] = {}
    async with asyncio.timeout(30):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http:
            reply = await http.post("/v1/responses", json=VALID)
            result["http"] = reply.status_code == 200 and reply.json()["status"] == "completed"
        async with websockets.connect(f"ws://127.0.0.1:{server.http_port}/v1/responses") as ws:
            await ws.send(orjson.dumps({"type": "response.create", **VALID}).decode())
            while (event := orjson.loads(await ws.recv()))["type"] not in TURN_ENDS:
                pass
            result["websocket"] = event["type"] == "response.completed"
        fuzzer = GrpcFuzzer(server.grpc_port)
        message = pb.ConnectRequest(response_create=params_to_pb(VALID)).SerializeToString()
        result["grpc"] = await fuzzer.connect_one(message) == "ok"
        await fuzzer.close()
    return result


def run_fuzz(
    inputs: int, workdir: Path
) -> tuple[dict[str, collections.Counter[str]], dict[str, Any]]:
    """Fuzz a fresh server with about ``inputs`` inputs; returns counts and the server's state."""
    recursion_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # json.dumps of the deepest generated values
    try:
        return _run_fuzz(inputs, workdir)
    finally:
        sys.setrecursionlimit(recursion_limit)


def _run_fuzz(
    inputs: int, workdir: Path
) -> tuple[dict[str, collections.Counter[str]], dict[str, Any]]:
    server = FuzzServer(workdir)
    server.start()
    loop = Loop()
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    try:
        # A tenth for the by-id calls, the rest in four equal shares.
        by_id = max(inputs // 10, 1)
        share = max((inputs - by_id) // 4, 1)
        http = loop.run(_make_http(server.http_port))

        def http_act(body: Any) -> None:
            raw = _dumps(body) if not isinstance(body, bytes) else body
            counts["http"][loop.run(http_one(http, raw))] += 1

        _fuzz(share, create_bodies() | st.binary(max_size=64), http_act)
        loop.run(http.aclose())

        ws = WsFuzzer(server.http_port)

        def ws_act(event: Any) -> None:
            frame = _dumps(event).decode(errors="replace")
            counts["websocket"][loop.run(ws.one(frame))] += 1

        _fuzz(share, client_events(), ws_act)
        loop.run(ws.reset())

        grpc_fuzzer = loop.run(_make_grpc(server.grpc_port))

        def connect_act(message: bytes) -> None:
            counts["grpc Connect"][loop.run(grpc_fuzzer.connect_one(message))] += 1

        _fuzz(share, connect_messages(), connect_act)

        def stateless_act(message: bytes) -> None:
            counts["grpc CreateResponse"][loop.run(grpc_fuzzer.stateless_one(message))] += 1

        _fuzz(max(inputs - 3 * share - by_id, 1), connect_messages(stateless=True), stateless_act)

        def by_id_act(request: tuple[str, str]) -> None:
            call, ident = request
            transport, outcome = (
                ("grpc by id", loop.run(grpc_by_id(grpc_fuzzer.channel, call, ident)))
                if len(ident) % 2
                else ("http by id", loop.run(http_by_id(http, call, ident)))
            )
            counts[transport][outcome] += 1

        http = loop.run(_make_http(server.http_port))
        _fuzz(by_id, by_id_requests(), by_id_act)
        loop.run(http.aclose())
        loop.run(grpc_fuzzer.close())
        state: dict[str, Any] = {"alive": server.alive}
        state["serves"] = loop.run(still_serves(server)) if server.alive else {}
    finally:
        loop.close()
        server.stop()
    state.update(log_counts(server.log_path.read_text(errors="replace")))
    return counts, state


def log_counts(log: str) -> dict[str, int]:
    """What a fuzzed server logged: every input is a client's fault, so none may be logged
    as a server error (ERROR, CRITICAL or a traceback)."""
    return {
        "tracebacks": log.count("Traceback"),
        "warnings": log.count(" WARNING "),
        "errors": sum(" ERROR " in line or " CRITICAL " in line for line in log.splitlines()),
    }


async def _make_http(port: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=DEADLINE_S + 5)


async def _make_grpc(port: int) -> GrpcFuzzer:
    return GrpcFuzzer(port)


def report(counts: dict[str, collections.Counter[str]], state: dict[str, Any]) -> tuple[str, bool]:
    """The summary table, and whether the run is clean."""
    columns = ("ok", "4xx", *BAD)
    lines = [f"{'transport':<22}{'inputs':>8}" + "".join(f"{c:>18}" for c in columns)]
    total = collections.Counter[str]()
    for transport, counter in counts.items():
        total.update(counter)
        lines.append(
            f"{transport:<22}{sum(counter.values()):>8}"
            + "".join(f"{counter.get(c, 0):>18}" for c in columns)
        )
    lines.append(
        f"{'total':<22}{sum(total.values()):>8}"
        + "".join(f"{total.get(c, 0):>18}" for c in columns)
    )
    serves = state.get("serves", {})
    lines.append(
        f"server alive afterwards: {state['alive']}; still serves: "
        + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in serves.items())
        + f"; tracebacks in its log: {state['tracebacks']}; ERROR lines: {state['errors']}; "
        f"WARNING lines: {state['warnings']}"
    )
    clean = (
        all(total.get(c, 0) == 0 for c in BAD)
        and state["alive"]
        and len(serves) == 3
        and all(serves.values())
        and state["tracebacks"] == 0
        and state["errors"] == 0
    )
    return "\n".join(lines), clean


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--inputs", type=int, default=10_000, help="inputs across transports")
    parser.add_argument(
        "--compressed-inputs", type=int, default=200, help="the compressed family (0: skip)"
    )
    parser.add_argument(
        "--connection-inputs", type=int, default=60, help="the connections family (0: skip)"
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fuzz-") as workdir:
        counts, state = run_fuzz(args.inputs, Path(workdir))
    table, clean = report(counts, state)
    print(table)
    print(f"{'clean' if clean else 'FAILED'} in {time.monotonic() - started:.0f} s")
    if args.compressed_inputs:
        from tests.fuzz import compressed  # the compressed paths: tests/fuzz/compressed.py

        clean = compressed.main(["--inputs", str(args.compressed_inputs)]) == 0 and clean
    if args.connection_inputs:
        from tests.fuzz import connections  # how clients hold connections: connections.py

        clean = connections.main(["--inputs", str(args.connection_inputs)]) == 0 and clean
    return 0 if clean else 1


if __name__ == "__main__":
    raise SystemExit(main())
