"""The benchmark's clients: one per mode, the agent loop they share, and the worker process.

Every mode runs the same agent loop (``run_agent``) over a different connection type; the
only differences are what each design sends and how:

===  ==============  =========================================================================
 #   key             what one turn is
===  ==============  =========================================================================
 1   http_new        POST /v1/responses (SSE), full history, a new TCP connection per turn
 2   http_keepalive  POST /v1/responses (SSE), full history, one kept-alive connection
 3   http_store      POST /v1/responses (SSE), new input + previous_response_id (store=true)
 4   ws_cache        WebSocket response.create, new input + previous_response_id (conn cache)
 5   ws_append       WebSocket, one response: response.done / response.append per tool call
 6   grpc_create     gRPC CreateResponse (server-streaming) per turn, full history
 7   grpc_connect    gRPC Connect stream, new input + previous_response_id (stream cache)
 8   grpc_append     gRPC Connect, one response: response_done / response_append per call
 9   grpc_single     as 7, one event per gRPC message (batching off: what a stock client gets)
10   grpc_slim       as 7, with slim snapshots (no echoed instructions and tools)
11   ws_batched      as 4, with batched frames (non-standard: a JSON array of the events
                     ready together per frame; a reference, no hosted-API client reads it)
===  ==============  =========================================================================

The gRPC modes use the project's client, which asks for batched messages (modes 6-8, 10);
mode 9 turns that off.

HTTP uses aiohttp (an efficient async client; the transport-floor note measured it 2-3x
faster than httpx). The WebSocket client is the ``websockets`` library with compression off,
as the OpenAI SDK connects. gRPC uses this project's ``AsyncResponsesClient``.

Clients run in worker processes (``worker_main``), separate from the server and from the
orchestrator; a worker receives commands over a pipe, runs them on its own event loop, and
sends back plain-dict results.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import traceback
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Literal, Protocol

import orjson
from bidi_responses.bench.cpu import process_cpu_clock
from bidi_responses.bench.wire import SocketBytes, WireCounter

__all__ = [
    "CLASSIC_MODES",
    "MODES",
    "BenchError",
    "Exchange",
    "ModeInfo",
    "ServerAddress",
    "TurnRecord",
    "resolve_modes",
    "worker_main",
]

History = Literal["full", "chain", "store", "append"]


@dataclass(frozen=True, slots=True)
class ModeInfo:
    """One way of running the agent loop."""

    number: int
    key: str
    label: str
    transport: Literal["http", "ws", "grpc"]
    history: History
    #: Ask for several events per message (gRPC ``batch_events``; WebSocket: non-standard).
    batch: bool = False
    #: gRPC slim snapshots (``SNAPSHOT_DETAIL_SLIM``).
    slim: bool = False

    @property
    def stateful(self) -> bool:
        """True when the server keeps the conversation in memory between turns."""
        return self.history in ("chain", "append")


MODES: dict[str, ModeInfo] = {
    m.key: m
    for m in (
        ModeInfo(1, "http_new", "HTTP full history, new conn/turn", "http", "full"),
        ModeInfo(2, "http_keepalive", "HTTP full history, keep-alive", "http", "full"),
        ModeInfo(3, "http_store", "HTTP previous_response_id (store)", "http", "store"),
        ModeInfo(4, "ws_cache", "WebSocket, connection cache", "ws", "chain"),
        ModeInfo(5, "ws_append", "WebSocket, append mode", "ws", "append"),
        ModeInfo(6, "grpc_create", "gRPC CreateResponse, full history", "grpc", "full", True),
        ModeInfo(7, "grpc_connect", "gRPC Connect, stream cache", "grpc", "chain", True),
        ModeInfo(8, "grpc_append", "gRPC Connect, append mode", "grpc", "append", True),
        ModeInfo(9, "grpc_single", "gRPC Connect, one event/message", "grpc", "chain"),
        ModeInfo(10, "grpc_slim", "gRPC Connect, slim snapshots", "grpc", "chain", True, True),
        ModeInfo(11, "ws_batched", "WebSocket, batched frames (non-standard)", "ws", "chain", True),
    )
}

#: The eight modes of the original comparison (the default of the shorter sweeps).
CLASSIC_MODES = "1,2,3,4,5,6,7,8"


def resolve_modes(spec: str | Sequence[str]) -> list[ModeInfo]:
    """Modes from ``"all"``, numbers (``"1,4,7"``) or keys (``"ws_cache,grpc_connect"``)."""
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    by_number = {str(m.number): m for m in MODES.values()}
    out: list[ModeInfo] = []
    for raw in parts:
        name = raw.strip()
        if not name:
            continue
        if name == "all":
            out.extend(MODES.values())
        elif name in MODES:
            out.append(MODES[name])
        elif name in by_number:
            out.append(by_number[name])
        else:
            known = ", ".join(f"{m.number}={m.key}" for m in MODES.values())
            raise ValueError(f"unknown mode {name!r} (known: {known}, or 'all')")
    return list(dict.fromkeys(out))


class BenchError(RuntimeError):
    """A turn failed (error event, failed response, HTTP error): the run is not valid."""


@dataclass(frozen=True, slots=True)
class ServerAddress:
    """Where the server under test listens."""

    host: str
    grpc_port: int
    http_port: int | None
    #: The server's process id, for reading its CPU time per turn (same machine).
    pid: int | None = None

    @property
    def ports(self) -> list[int]:
        """Every port the server listens on (for byte accounting)."""
        return [p for p in (self.grpc_port, self.http_port) if p]


# -- one exchange on a connection ---------------------------------------------------------

_TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete"})


@dataclass(slots=True)
class Exchange:
    """What a client saw of one turn: timestamps (perf_counter), counts, the last event."""

    t_send: float
    t_end: float = 0.0
    t_first_delta: float | None = None
    t_last_delta: float | None = None
    events: int = 0
    #: Transport messages (gRPC messages, WebSocket frames) that carried the events; None
    #: where the client cannot see them (SSE, CreateResponse).
    messages: int | None = None
    deltas: int = 0
    final: dict[str, Any] = field(default_factory=dict)
    wire_after: SocketBytes | None = None

    def observe(self, event: dict[str, Any]) -> bool:
        """Count one event; True when it ends the turn."""
        now = time.perf_counter()
        self.events += 1
        kind = event.get("type", "")
        if kind.endswith(".delta"):
            self.deltas += 1
            if self.t_first_delta is None:
                self.t_first_delta = now
            self.t_last_delta = now
            return False
        if kind in _TERMINAL or kind == "error" or kind == "response.done":
            self.t_end = now
            self.final = event
            return True
        return False


class Conn(Protocol):
    """One client connection of a mode (opened per rollout or shared by agents)."""

    async def create(self, body: dict[str, Any]) -> Exchange:
        """Send a create and read events up to the turn's end."""
        ...

    async def append(self, response_id: str, items: list[dict[str, Any]]) -> Exchange:
        """Send tool outputs to a waiting response (append modes only)."""
        ...

    async def aclose(self, abort: bool = False) -> None:
        """Close what this connection owns; ``abort`` drops a response still waiting."""
        ...


def _snapshot(wire: WireCounter | None) -> SocketBytes | None:
    return wire.snapshot() if wire is not None else None


class HttpConn:
    """POST /v1/responses with ``stream: true``, events read from SSE."""

    def __init__(self, session: Any, base: str, wire: WireCounter | None) -> None:
        self._session = session
        self._url = f"{base}/v1/responses"
        self._wire = wire

    async def create(self, body: dict[str, Any]) -> Exchange:
        """One POST; the connection is reused or not according to the session's connector."""
        ex = Exchange(t_send=time.perf_counter())
        payload = orjson.dumps({**body, "stream": True})
        async with self._session.post(
            self._url, data=payload, headers={"Content-Type": "application/json"}
        ) as resp:
            if resp.status != 200:
                text = await resp.text()
                raise BenchError(f"HTTP {resp.status}: {text[:500]}")
            buffer = b""
            done = False
            async for chunk in resp.content.iter_any():
                if done:
                    continue  # drain to EOF so that keep-alive can reuse the connection
                buffer += chunk
                while not done:
                    cut = buffer.find(b"\n\n")
                    if cut < 0:
                        break
                    block, buffer = buffer[:cut], buffer[cut + 2 :]
                    for line in block.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            continue
                        if ex.observe(orjson.loads(data)):
                            done = True
                            # Before the connection closes (mode 1 closes it per turn).
                            ex.wire_after = _snapshot(self._wire)
                            break
            if not done:
                raise BenchError("the SSE stream ended before the response did")
        return ex

    async def append(self, response_id: str, items: list[dict[str, Any]]) -> Exchange:
        """HTTP has no append (the prototype shape needs a stream)."""
        raise BenchError("append mode is not served over HTTP")

    async def aclose(self, abort: bool = False) -> None:
        """The session is owned by whoever created it."""


class WsConn:
    """One WebSocket connection on GET /v1/responses, JSON text frames."""

    def __init__(self, ws: Any, wire: WireCounter | None) -> None:
        self._ws = ws
        self._wire = wire

    @classmethod
    async def open(cls, base: str, wire: WireCounter | None, batch: bool = False) -> WsConn:
        """Connect (no compression, no frame size limit, as the OpenAI SDK connects);
        ``batch`` asks for the non-standard batched frames."""
        from websockets.asyncio.client import connect

        url = base.replace("http://", "ws://", 1) + "/v1/responses"
        if batch:
            url += "?batch_frames=1"
        ws = await connect(url, max_size=None, compression=None, open_timeout=30)
        return cls(ws, wire)

    async def _exchange(self, message: dict[str, Any]) -> Exchange:
        ex = Exchange(t_send=time.perf_counter(), messages=0)
        await self._ws.send(orjson.dumps(message).decode())
        while True:
            frame = orjson.loads(await self._ws.recv())
            ex.messages = (ex.messages or 0) + 1
            for event in frame if isinstance(frame, list) else (frame,):
                if ex.observe(event):
                    ex.wire_after = _snapshot(self._wire)
                    return ex

    async def create(self, body: dict[str, Any]) -> Exchange:
        """A ``response.create`` frame."""
        return await self._exchange({"type": "response.create", **body})

    async def append(self, response_id: str, items: list[dict[str, Any]]) -> Exchange:
        """A ``response.append`` frame."""
        return await self._exchange(
            {"type": "response.append", "response_id": response_id, "input": items}
        )

    async def aclose(self, abort: bool = False) -> None:
        """Close the socket (the server cancels anything still waiting)."""
        await self._ws.close()


class GrpcConnectConn:
    """One Connect stream of our gRPC client."""

    def __init__(self, client: Any, wire: WireCounter | None) -> None:
        self._client = client
        self._wire = wire
        self._stack = contextlib.AsyncExitStack()
        self._stream: Any = None

    async def open(self) -> GrpcConnectConn:
        """Open the stream."""
        self._stream = await self._stack.enter_async_context(self._client.connect())
        return self

    async def _drain(self, events: AsyncIterator[dict[str, Any]], ex: Exchange) -> Exchange:
        before = self._stream.messages_received
        async with contextlib.aclosing(events):  # type: ignore[type-var]
            async for event in events:
                if ex.observe(event):
                    ex.wire_after = _snapshot(self._wire)
                    ex.messages = self._stream.messages_received - before
                    return ex
        raise BenchError("the Connect stream ended before the response did")

    async def create(self, body: dict[str, Any]) -> Exchange:
        """``response_create`` on the stream."""
        ex = Exchange(t_send=time.perf_counter())
        return await self._drain(self._stream.create_events(**body), ex)

    async def append(self, response_id: str, items: list[dict[str, Any]]) -> Exchange:
        """``response_append`` on the stream."""
        ex = Exchange(t_send=time.perf_counter())
        return await self._drain(self._stream.append_events(response_id, items), ex)

    async def aclose(self, abort: bool = False) -> None:
        """Half-close the stream and wait for its end; ``abort`` cancels the call first.

        A half-close lets in-flight responses finish, and an append-mode response that was
        left waiting for tool outputs would only finish at its append timeout.
        """
        if abort and self._stream is not None:
            self._stream.abort()
        await self._stack.aclose()


class GrpcCreateConn:
    """The stateless CreateResponse call, one per turn, on a kept channel."""

    def __init__(self, client: Any, wire: WireCounter | None) -> None:
        self._client = client
        self._wire = wire

    async def create(self, body: dict[str, Any]) -> Exchange:
        """One server-streaming call."""
        ex = Exchange(t_send=time.perf_counter())
        events = self._client.create_events(**body)
        async with contextlib.aclosing(events):
            async for event in events:
                if not ex.final and ex.observe(event):
                    ex.wire_after = _snapshot(self._wire)
                # After the terminal event, read on to the call's status, as a client should:
                # an abandoned call is cancelled (RST_STREAM) instead of ending cleanly.
        if not ex.final:
            raise BenchError("the CreateResponse call ended before the response did")
        return ex

    async def append(self, response_id: str, items: list[dict[str, Any]]) -> Exchange:
        """CreateResponse has no append."""
        raise BenchError("append mode needs a Connect stream")

    async def aclose(self, abort: bool = False) -> None:
        """The channel is owned by whoever created it."""


class ClientKit:
    """The shared client objects of one worker run: an HTTP session, a gRPC channel.

    One agent per process gets fresh ones per rollout, so every rollout pays its own
    connection setup; with several agents in a process they share what the library is meant
    to share (an aiohttp session's pool, a gRPC channel's HTTP/2 connection), while each
    agent has its own WebSocket connection or Connect stream.
    """

    def __init__(self, mode: ModeInfo, server: ServerAddress, wire: WireCounter | None) -> None:
        self.mode = mode
        self.server = server
        self.wire = wire
        self.base = f"http://{server.host}:{server.http_port}"
        self._session: Any = None
        self._grpc: Any = None

    async def __aenter__(self) -> ClientKit:
        if self.mode.transport == "http":
            import aiohttp

            # Mode 1 closes the connection after each response: a new TCP connection per turn.
            connector = aiohttp.TCPConnector(force_close=self.mode.key == "http_new", limit=0)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None)
            )
        elif self.mode.transport == "grpc":
            from bidi_responses.client.aio import AsyncResponsesClient

            self._grpc = AsyncResponsesClient(
                f"{self.server.host}:{self.server.grpc_port}",
                batch_events=self.mode.batch,
                snapshots="slim" if self.mode.slim else "full",
            )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
        if self._grpc is not None:
            await self._grpc.close()

    async def conn(self) -> Conn:
        """A connection for one agent."""
        mode = self.mode
        if mode.transport == "http":
            return HttpConn(self._session, self.base, self.wire)
        if mode.transport == "ws":
            return await WsConn.open(self.base, self.wire, batch=mode.batch)
        if mode.history in ("chain", "append"):
            return await GrpcConnectConn(self._grpc, self.wire).open()
        return GrpcCreateConn(self._grpc, self.wire)


# -- the agent loop -----------------------------------------------------------------------


@dataclass(slots=True)
class TurnRecord:
    """One turn as the client saw it, with the server's counters for that turn."""

    mode: str
    repeat: int
    agent: int
    turn: int
    setup: bool
    history_tokens: int
    input_items: int
    turn_ms: float
    ttft_ms: float | None
    engine_ms: float
    overhead_ms: float
    api_pre_ms: float
    api_post_ms: float
    tokens_rendered: int
    tokens_reused: int
    items_validated: int
    prefill_tokens: int
    bytes_sent: int | None
    bytes_received: int | None
    events: int
    deltas: int
    #: Transport messages that carried the turn's events (None: not visible to the client).
    messages: int | None = None
    #: Server CPU time for this turn (None when several agents share the server).
    server_cpu_ms: float | None = None
    #: This client process's CPU time for this turn.
    client_cpu_ms: float | None = None
    #: Time per pre-inference pipeline stage (``response.stats.stage_ms``) for this turn.
    stage_ms: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class AgentRun:
    """What ``run_agent`` returns: the turns and the rollout's wall-clock span."""

    turns: list[TurnRecord]
    t_start: float
    t_end: float
    final_status: str
    #: True when the loop stopped while an append-mode response still waits for outputs.
    waiting: bool = False


_CUMULATIVE = ("engine_ms", "tokens_rendered", "items_validated", "prefill_tokens", "api_post_ms")


async def run_agent(
    conn: Conn,
    mode: ModeInfo,
    *,
    base: dict[str, Any],
    first_input: list[dict[str, Any]],
    output_for: Callable[[int], str],
    tool_ms: float = 0.0,
    max_tool_turns: int | None = None,
    setup_turns: int = 0,
    repeat: int = 0,
    agent: int = 0,
    wire: WireCounter | None = None,
    server_cpu: Callable[[], float] | None = None,
    progress: Callable[[], None] | None = None,
) -> AgentRun:
    """Run one agent until the model answers (or ``max_tool_turns`` outputs were sent).

    ``base`` is the constant part of every create (model, instructions, tools, store); the
    first ``setup_turns`` turns are marked as setup (the history sweep's prefill).
    ``server_cpu`` reads the server's CPU time (seconds); with one agent on the server, a
    turn's share is the CPU used from the end of the previous turn to the end of this one.
    """
    history: list[dict[str, Any]] = []
    new_input = list(first_input)
    previous: dict[str, Any] | None = None
    last_stats: dict[str, float] = {}
    last_stages: dict[str, float] = {}
    records: list[TurnRecord] = []
    tool_turn = 0
    cpu_mark = server_cpu() if server_cpu is not None else 0.0
    own_mark = time.process_time()
    t_start = time.perf_counter()
    while True:
        before = _snapshot(wire)
        if mode.history == "append" and previous is not None:
            ex = await conn.append(previous["id"], new_input)
        else:
            body = dict(base)
            if mode.history == "full":
                body["input"] = history + new_input
            else:
                body["input"] = new_input
                if previous is not None:
                    body["previous_response_id"] = previous["id"]
            if mode.history == "append":
                body["append_mode"] = True
            if mode.history == "store":
                body["store"] = True
            ex = await conn.create(body)
        event = ex.final
        kind = event.get("type")
        if kind == "error":
            raise BenchError(f"{mode.key} turn {len(records)}: error event {event.get('error')}")
        response = event["response"]
        if response.get("status") == "failed":
            raise BenchError(f"{mode.key} turn {len(records)}: failed: {response.get('error')}")
        stats = response.get("stats") or {}
        if mode.history == "append":
            # One long response: its counters are cumulative, a turn is the difference.
            turn_stats = {k: float(stats.get(k, 0)) - last_stats.get(k, 0.0) for k in _CUMULATIVE}
            last_stats = {k: float(stats.get(k, 0)) for k in _CUMULATIVE}
            stages = {k: float(v) for k, v in (stats.get("stage_ms") or {}).items()}
            stage_ms = {k: v - last_stages.get(k, 0.0) for k, v in stages.items()}
            last_stages = stages
            history_tokens = int(last_stats["tokens_rendered"])
            pre_ms = float(stats.get("api_pre_ms", 0.0)) if previous is None else 0.0
        else:
            turn_stats = {k: float(stats.get(k, 0)) for k in _CUMULATIVE}
            stage_ms = {k: float(v) for k, v in (stats.get("stage_ms") or {}).items()}
            usage = response.get("usage") or {}
            history_tokens = int(usage.get("input_tokens", 0))
            pre_ms = float(stats.get("api_pre_ms", 0.0))
        sent = received = None
        if wire is not None and before is not None and ex.wire_after is not None:
            sent, received = WireCounter.delta(before, ex.wire_after)
        cpu_ms: float | None = None
        if server_cpu is not None:
            now = server_cpu()
            cpu_ms, cpu_mark = (now - cpu_mark) * 1000, now
        own = time.process_time()
        client_ms, own_mark = (own - own_mark) * 1000, own
        turn_ms = (ex.t_end - ex.t_send) * 1000
        engine_ms = turn_stats["engine_ms"]
        records.append(
            TurnRecord(
                mode=mode.key,
                repeat=repeat,
                agent=agent,
                turn=len(records),
                setup=len(records) < setup_turns,
                history_tokens=history_tokens,
                input_items=len(new_input),
                turn_ms=turn_ms,
                ttft_ms=(ex.t_first_delta - ex.t_send) * 1000 if ex.t_first_delta else None,
                engine_ms=engine_ms,
                overhead_ms=turn_ms - engine_ms,
                api_pre_ms=pre_ms,
                api_post_ms=turn_stats["api_post_ms"],
                tokens_rendered=int(turn_stats["tokens_rendered"]),
                tokens_reused=int(stats.get("tokens_reused", 0)),
                items_validated=int(turn_stats["items_validated"]),
                prefill_tokens=int(turn_stats["prefill_tokens"]),
                bytes_sent=sent,
                bytes_received=received,
                events=ex.events,
                deltas=ex.deltas,
                messages=ex.messages,
                server_cpu_ms=cpu_ms,
                client_cpu_ms=client_ms,
                stage_ms=stage_ms,
            )
        )
        if progress is not None:
            progress()
        if kind == "response.done":
            calls = list(event.get("pending_calls") or [])
        elif mode.history == "append":
            calls = []  # the terminal event of the one long response: its output has every call
        else:
            calls = [i for i in response.get("output", ()) if i.get("type") == "function_call"]
        if mode.history == "full":
            # The client keeps the conversation and sends all of it next time, echoing the
            # model's items as it received them (as Codex does over HTTP).
            history.extend(new_input)
            history.extend(response.get("output", ()))
        previous = response
        if not calls or (max_tool_turns is not None and tool_turn >= max_tool_turns):
            break
        if tool_ms > 0:
            await asyncio.sleep(tool_ms / 1000)
        new_input = [
            {
                "type": "function_call_output",
                "call_id": call["call_id"],
                "output": output_for(tool_turn),
            }
            for call in calls
        ]
        tool_turn += 1
    return AgentRun(
        records,
        t_start,
        time.perf_counter(),
        str(previous.get("status", "")),
        waiting=kind == "response.done",
    )


# -- worker commands ----------------------------------------------------------------------


def _base_body(cmd: dict[str, Any]) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": cmd.get("model", "sim-model"),
        "store": bool(cmd.get("store_all", False)),
    }
    if cmd.get("instructions"):
        base["instructions"] = cmd["instructions"]
    if cmd.get("tools"):
        base["tools"] = cmd["tools"]
    if cmd.get("tool_choice"):
        base["tool_choice"] = cmd["tool_choice"]
    return base


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def _cmd_agents(cmd: dict[str, Any], progress: Callable[[], None]) -> dict[str, Any]:
    """Run ``agents`` rollouts concurrently (one rollout when ``agents`` is 1)."""
    mode = MODES[cmd["mode"]]
    server: ServerAddress = cmd["server"]
    agents = int(cmd.get("agents", 1))
    wire = WireCounter(server.host, server.ports) if cmd.get("bytes", True) else None
    outputs: list[str] = cmd["tool_outputs"]
    first_input: list[dict[str, Any]] = cmd.get("first_input") or []
    base = _base_body(cmd)

    async def one(kit: ClientKit, index: int) -> AgentRun:
        conn = await kit.conn()
        run: AgentRun | None = None
        try:
            first = list(first_input) or [
                _user(f"Session {cmd['nonce']}-{index}.\n\n{cmd['user_text']}")
            ]
            run = await run_agent(
                conn,
                mode,
                base=base,
                first_input=first,
                output_for=lambda turn: outputs[turn % len(outputs)],
                tool_ms=float(cmd.get("tool_ms", 0.0)),
                max_tool_turns=cmd.get("max_tool_turns"),
                setup_turns=int(cmd.get("setup_turns", 0)),
                repeat=int(cmd.get("repeat", 0)),
                agent=int(cmd.get("agent_base", 0)) + index,
                wire=wire,
                server_cpu=server_cpu if agents == 1 else None,
                progress=progress,
            )
            return run
        finally:
            await conn.aclose(abort=run is None or run.waiting)

    server_cpu = process_cpu_clock(server.pid) if server.pid else None
    cpu0 = os.times()
    t0 = time.perf_counter()
    if agents == 1:
        # Each rollout opens its own clients, so it pays its own connection setup.
        async with ClientKit(mode, server, wire) as kit:
            runs = [await one(kit, 0)]
    else:
        async with ClientKit(mode, server, None) as kit:
            runs = list(await asyncio.gather(*(one(kit, i) for i in range(agents))))
    t1 = time.perf_counter()
    cpu1 = os.times()
    return {
        "turns": [asdict(r) for run in runs for r in run.turns],
        "rollouts": [
            {
                "agent": r.turns[0].agent if r.turns else 0,
                "t_start": r.t_start,
                "t_end": r.t_end,
                "e2e_s": r.t_end - r.t_start,
                "turns": len(r.turns),
                "status": r.final_status,
            }
            for r in runs
        ],
        "t_start": t0,
        "t_end": t1,
        "client_cpu_s": (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system),
    }


async def _cmd_keepup(cmd: dict[str, Any], progress: Callable[[], None]) -> dict[str, Any]:
    """Long text answers on one stream: how fast do deltas arrive, against the engine rate."""
    mode = MODES[cmd["mode"]]
    server: ServerAddress = cmd["server"]
    results = []
    t0 = time.perf_counter()
    async with ClientKit(mode, server, None) as kit:
        conn = await kit.conn()
        try:
            previous: str | None = None
            for index in range(int(cmd["responses"])):
                body: dict[str, Any] = {
                    "model": "sim-model",
                    "store": False,
                    "input": [_user(f"Continue ({index}).")],
                }
                if previous is not None:
                    body["previous_response_id"] = previous
                ex = await conn.create(body)
                if ex.final.get("type") != "response.completed":
                    raise BenchError(f"keep-up response ended with {ex.final}")
                response = ex.final["response"]
                previous = response["id"]
                usage = response.get("usage") or {}
                results.append(
                    {
                        "output_tokens": int(usage.get("output_tokens", 0)),
                        "t_send": ex.t_send,
                        "t_first_delta": ex.t_first_delta,
                        "t_last_delta": ex.t_last_delta,
                        "t_end": ex.t_end,
                        "deltas": ex.deltas,
                        "events": ex.events,
                        "engine_ms": float((response.get("stats") or {}).get("engine_ms", 0.0)),
                    }
                )
                progress()
        finally:
            await conn.aclose()
    return {"responses": results, "t_start": t0, "t_end": time.perf_counter()}


_COMMANDS = {"agents": _cmd_agents, "keepup": _cmd_keepup}


def worker_main(conn: Connection) -> None:
    """A client process: run commands from the pipe until it sends None.

    Messages back are ``("progress", 1)`` per turn, then ``("result", dict)`` or
    ``("error", text)``.
    """
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        while True:
            try:
                cmd = conn.recv()
            except EOFError:
                return
            if cmd is None:
                return
            handler = _COMMANDS[cmd["cmd"]]
            try:
                result = loop.run_until_complete(handler(cmd, lambda: conn.send(("progress", 1))))
            except Exception:
                conn.send(("error", traceback.format_exc()))
            else:
                conn.send(("result", result))
    finally:
        loop.close()
