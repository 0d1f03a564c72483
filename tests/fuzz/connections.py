"""Fuzz how clients hold connections: the account of connections stays exact and another
address stays served, whatever the others do.

``python -m tests.fuzz.connections --inputs 60`` (part of ``make fuzz``) starts ``bidi-responses
serve`` with small limits (24 HTTP connections, 8 per address) and, for each drawn input, runs
a burst of actions from loopback addresses 127.0.0.1-4 at once: idle connections, half a
request, garbage bytes, a request with keep-alive, a WebSocket left open, a WebSocket upgrade
then a close mid-frame, idle gRPC connections; then checks that 127.0.0.9 is served on HTTP
(an answer or a clear 429/503 never counts as served), closes everything, and checks that the
server's ``bidi_open_connections`` is back to what the checker itself holds. Exit status 1 on
any check that fails, a traceback or ERROR line in the log, or a server that no longer serves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import resource
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import websockets
from hypothesis import strategies as st

from tests.faults.descriptor_flood import Server, other_client, serve
from tests.fuzz.run import Loop, _fuzz, log_counts

ACTIONS = (
    "idle",
    "half request",
    "garbage",
    "keep-alive request",
    "websocket held",
    "websocket cut mid-frame",
    "grpc idle",
)
SOURCES = ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4")
CHECKER = "127.0.0.9"
LIMITS: dict[str, int | bool] = {"max_connections": 24, "max_connections_per_peer": 8}


@dataclass(slots=True)
class Tally:
    inputs: int = 0
    actions: int = 0
    checker_served: int = 0
    checker_refused: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)


@st.composite
def bursts(draw: st.DrawFn) -> list[tuple[str, str]]:
    """Up to 40 (source address, action) pairs run at once."""
    return draw(
        st.lists(
            st.tuples(st.sampled_from(SOURCES), st.sampled_from(ACTIONS)), min_size=1, max_size=40
        )
    )


async def _act(server: Server, source: str, action: str, stack: contextlib.AsyncExitStack) -> None:
    """Start one action; what it opens stays open until ``stack`` closes."""
    port = server.grpc_port if action == "grpc idle" else server.http_port
    with contextlib.suppress(OSError, websockets.WebSocketException, httpx.HTTPError):
        if action.startswith("websocket"):
            ws = await stack.enter_async_context(
                websockets.connect(
                    f"ws://127.0.0.1:{server.http_port}/v1/responses",
                    local_addr=(source, 0),
                    compression=None,
                    open_timeout=5,
                )
            )
            if action == "websocket cut mid-frame":
                # A text frame header announcing 1,000 bytes, then 10 of them.
                ws.transport.write(b"\x81\xfe\x03\xe8" + b"\x00" * 4 + b"{" * 10)
            return
        if action == "keep-alive request":
            client = await stack.enter_async_context(
                httpx.AsyncClient(
                    transport=httpx.AsyncHTTPTransport(local_address=source), timeout=5
                )
            )
            await client.get(f"http://127.0.0.1:{server.http_port}/healthz")
            return
        _, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        stack.callback(writer.close)
        if action == "half request":
            writer.write(b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{")
        elif action == "garbage":
            writer.write(b"\x16\x03\x01\x02\x00\xff" * 20)


async def _open_connections(server: Server) -> int:
    async with httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(local_address=CHECKER), timeout=10
    ) as http:
        text = (await http.get(f"http://127.0.0.1:{server.http_port}/metrics")).text
    found = re.search(r'^bidi_open_connections\{transport="http"\} (\S+)$', text, re.MULTILINE)
    return int(float(found[1])) if found else -1


async def _burst(server: Server, burst: list[tuple[str, str]], tally: Tally) -> None:
    tally.inputs += 1
    tally.actions += len(burst)
    async with contextlib.AsyncExitStack() as stack:
        await asyncio.gather(*(_act(server, source, action, stack) for source, action in burst))
        served = await other_client(server, CHECKER)
        if served.http and served.websocket and served.grpc:
            tally.checker_served += 1
        else:
            tally.checker_refused.append(f"{burst}: {served.failures}")
    # Everything the burst opened is closed: the account must come back to the checker's own
    # connection (the scrape), once the server has seen the closes.
    async with asyncio.timeout(15):
        while True:
            held = await _open_connections(server)
            if held <= 1:
                break
            await asyncio.sleep(0.05)  # polling: the server sees the closes on its own time
    if held < 0:
        tally.leaks.append(f"after {burst}: no bidi_open_connections on /metrics")


def run_connection_fuzz(inputs: int, workdir: Path) -> tuple[Tally, dict[str, Any]]:
    loop = Loop()
    tally = Tally()
    state: dict[str, Any] = {}
    stack = contextlib.AsyncExitStack()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        server = loop.run(stack.enter_async_context(serve(workdir, hard, LIMITS)))

        def act(burst: list[tuple[str, str]]) -> None:
            try:
                loop.run(_burst(server, burst, tally))
            except TimeoutError:
                tally.leaks.append(f"after {burst}: connections still counted after 15 s")

        _fuzz(inputs, bursts(), act)
        state["alive"] = server.process.returncode is None
    finally:
        loop.run(stack.aclose())
        loop.close()
    log = (workdir / "server.log").read_text(errors="replace")
    state.update(log_counts(log))
    at = log.find(" ERROR ")
    state["first_error"] = log[max(at - 100, 0) : at + 1500] if at >= 0 else ""
    return tally, state


def clean(tally: Tally, state: dict[str, Any]) -> bool:
    return (
        state["alive"]
        and not tally.checker_refused
        and not tally.leaks
        and state["tracebacks"] == 0
        and state["errors"] == 0
    )


def summary(tally: Tally, state: dict[str, Any]) -> str:
    lines = [
        f"connections: {tally.inputs} bursts, {tally.actions} actions from {len(SOURCES)} "
        f"addresses; {CHECKER} served on HTTP, WebSocket and gRPC after "
        f"{tally.checker_served} of {tally.inputs}; account back to zero after every burst: "
        f"{'yes' if not tally.leaks else 'NO'}; tracebacks {state['tracebacks']}, ERROR lines "
        f"{state['errors']}"
    ]
    lines += [f"  not served: {line}" for line in tally.checker_refused[:5]]
    lines += [f"  leak: {line}" for line in tally.leaks[:5]]
    if state["first_error"]:
        lines.append(f"  first ERROR: {state['first_error']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--inputs", type=int, default=60)
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fuzz-connections-") as workdir:
        tally, state = run_connection_fuzz(args.inputs, Path(workdir))
    ok = clean(tally, state)
    print(summary(tally, state))
    print(f"{'clean' if ok else 'FAILED'} in {time.monotonic() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
