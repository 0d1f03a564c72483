"""A descriptor flood against a ``serve`` process started under a low RLIMIT_NOFILE: one
loopback address opens many idle connections to a listener, and meanwhile another address
must still be served (HTTP, WebSocket mode, gRPC) and the server's log must stay short.

Used by ``tests/hostile/test_descriptor_flood.py`` (small, in ``make test``) and by
``make faults`` (``python -m tests.faults.descriptor_flood``, larger, with figures).
Everything targets loopback, is bounded in count and time, and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import resource
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import websockets
from bidi_responses.client import AsyncResponsesClient

SMALL = {"model": "sim-model", "input": "hi", "store": False}


@dataclass(slots=True)
class Served:
    """Whether the other address was served on each transport, during and after the flood."""

    http: bool = False
    websocket: bool = False
    grpc: bool = False
    failures: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Server:
    process: asyncio.subprocess.Process
    log: Path
    grpc_port: int
    http_port: int

    def log_lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()


def _raise_own_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@contextlib.asynccontextmanager
async def serve(
    tmp: Path, nofile: int, limits: dict[str, int | bool], launcher: tuple[str, ...] = ()
) -> AsyncIterator[Server]:
    """``bidi-responses serve`` with RLIMIT_NOFILE (soft and hard) at ``nofile`` and these
    ``[limits]``; stopped with SIGTERM at the end (SIGKILL if it does not stop).
    ``launcher``: a script to run instead of ``-m bidi_responses.server.cli`` (a comparison
    with another build of the server)."""
    config = tmp / "server.toml"
    toml = "".join(f"{k} = {str(v).lower()}\n" for k, v in limits.items())
    config.write_text("[limits]\n" + toml)
    log = tmp / "server.log"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, *(launcher or ("-m", "bidi_responses.server.cli")), "serve",
            "--config", str(config), "--grpc-port", "0", "--http-port", "0",
            "--data-dir", str(tmp / "data"), "--sim-tps", "5000", "--sim-ttft-ms", "1",
            # What is measured is the server: a create near the message limit (~2M tokens)
            # must not spend the default simulated prefill's 20 s before its answer.
            "--sim-prefill-tps", "1e9",
            stdout=out, stderr=out, preexec_fn=limit,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    try:
        async with asyncio.timeout(60):
            while True:
                found = re.search(
                    r"gRPC on 127\.0\.0\.1:(\d+), .*http://127\.0\.0\.1:(\d+)/v1",
                    log.read_text(errors="replace"),
                )
                if found:
                    break
                if process.returncode is not None:
                    raise AssertionError(log.read_text())
                await asyncio.sleep(0.05)  # polling a file another process writes
        yield Server(process, log, int(found[1]), int(found[2]))
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(30):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


async def flood(port: int, count: int, source: str = "127.0.0.1") -> list[asyncio.StreamWriter]:
    """``count`` idle connections from ``source`` (those the server refuses at once too)."""
    _raise_own_limit()
    held: list[asyncio.StreamWriter] = []

    async def one() -> None:
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
            held.append(writer)

    for start in range(0, count, 100):
        await asyncio.gather(*(one() for _ in range(min(100, count - start))))
    return held


def close_all(held: list[asyncio.StreamWriter]) -> None:
    for writer in held:
        writer.close()


async def other_client(server: Server, source: str = "127.0.0.2") -> Served:
    """One request on each transport from ``source``, each within 10 s."""
    served = Served()
    try:
        async with (
            asyncio.timeout(10),
            httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(local_address=source), timeout=10
            ) as http,
        ):
            url = f"http://127.0.0.1:{server.http_port}/v1/responses"
            reply = await http.post(url, json=SMALL)
            served.http = reply.status_code == 200
            if not served.http:
                served.failures.append(f"http {reply.status_code} {reply.text[:200]}")
    except (OSError, httpx.HTTPError, TimeoutError) as error:
        served.failures.append(f"http {error!r}")
    try:
        async with (
            asyncio.timeout(10),
            websockets.connect(
                f"ws://127.0.0.1:{server.http_port}/v1/responses",
                local_addr=(source, 0),
                compression=None,
            ) as ws,
        ):
            await ws.send(orjson.dumps({"type": "response.create", **SMALL}).decode())
            while True:
                event = orjson.loads(await ws.recv())
                if event["type"] in ("response.completed", "error"):
                    served.websocket = event["type"] == "response.completed"
                    break
    except (OSError, websockets.WebSocketException, TimeoutError) as error:
        served.failures.append(f"websocket {error!r}")
    try:
        async with (
            asyncio.timeout(10),
            AsyncResponsesClient(f"127.0.0.1:{server.grpc_port}") as client,
        ):
            served.grpc = (await client.create(**SMALL)).status == "completed"
    except Exception as error:  # any failure of the call is the finding
        served.failures.append(f"grpc {error!r}")
    return served


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nofile", type=int, default=1024)
    parser.add_argument("--connections", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=Path("faults-out/descriptor-flood"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    failed = False
    cases: tuple[tuple[str, dict[str, int | bool]], ...] = (
        ("defaults", {}),
        # A configured limit above what the descriptors allow: accept() runs out anyway.
        ("past-the-descriptors", {"max_connections": 100_000, "max_connections_per_peer": 0}),
    )
    for name, limits in cases:
        tmp = args.out / name
        tmp.mkdir(exist_ok=True)
        async with serve(tmp, args.nofile, limits) as server:
            started = time.perf_counter()
            held = await flood(server.http_port, args.connections)
            during = await other_client(server)
            fds = open_descriptors(server.process.pid)
            close_all(held)
            after = await other_client(server)
            lines = server.log_lines()
            print(
                f"{name}: {args.connections} connections from one address under "
                f"RLIMIT_NOFILE {args.nofile}: server descriptors {fds}; another address "
                f"served during (http {during.http}, websocket {during.websocket}, grpc "
                f"{during.grpc}) and after (http {after.http}, websocket {after.websocket}, "
                f"grpc {after.grpc}); log {len(lines)} lines; "
                f"{time.perf_counter() - started:.1f} s"
            )
            for failure in during.failures + after.failures:
                print(f"  {failure}")
            ok = after.http and after.websocket and after.grpc and len(lines) < 100
            if name == "defaults":
                ok = ok and during.http and during.websocket and during.grpc
            failed = failed or not ok
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    asyncio.run(main())
