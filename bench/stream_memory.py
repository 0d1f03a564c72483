"""Benchmark: the memory an open stream holds on the server, broken down by where it was
allocated.

The server runs in this process under ``tracemalloc``; a client process opens ``--streams``
WebSocket-mode connections or Connect streams, runs one small unstored turn on each (so every
stream has met its first response: lane, route, encoder caches), and holds them open, idle. The
server's traced memory before and after, divided by the streams, is what one idle open stream
costs; the breakdown groups it by the first frame of each allocation's traceback inside the
project (or, for allocations the project did not make, the first frame outside the standard
library's asyncio). Run::

    python -m bidi_responses.bench.stream_memory --transport websocket --streams 200
    python -m bidi_responses.bench.stream_memory --transport connect --streams 200

The cached state of the turn is left out of the per-stream figure by ``store: false`` and a
tiny input: what remains is the stream itself.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import tracemalloc
from collections import defaultdict
from pathlib import Path

_CLIENT = r"""
import asyncio, json, sys

async def websocket(port: int, n: int) -> None:
    import websockets
    conns = []
    for _ in range(n):
        ws = await websockets.connect(f"ws://127.0.0.1:{port}/v1/responses", max_size=None)
        await ws.send(json.dumps({"type": "response.create", "model": "sim-model",
                                  "input": "hi", "store": False}))
        while json.loads(await ws.recv())["type"] != "response.completed":
            pass
        conns.append(ws)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

async def connect(port: int, n: int) -> None:
    from contextlib import AsyncExitStack
    import grpc
    from bidi_responses.client import AsyncResponsesClient
    async with AsyncExitStack() as stack:
        for i in range(n):
            if i % 50 == 0:  # the server takes 100 streams per connection
                # A subchannel pool of its own: channels to one target share a connection.
                target = f"127.0.0.1:{port}"
                channel = grpc.aio.insecure_channel(
                    target, options=[("grpc.use_local_subchannel_pool", 1)]
                )
                client = await stack.enter_async_context(
                    AsyncResponsesClient(target, channel=channel)
                )
            stream = await stack.enter_async_context(client.connect())
            await stream.create(model="sim-model", input="hi", store=False)
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

transport, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
asyncio.run((websocket if transport == "websocket" else connect)(port, n))
"""


def _site(trace: tracemalloc.Traceback) -> str:
    """Where an allocation belongs: the innermost frame of the project, followed by the
    innermost frame when that is in a library the project called."""
    frames = list(trace)  # oldest call first
    inner = frames[-1]
    here = f"{_short(inner.filename)}:{inner.lineno}"
    for frame in reversed(frames):
        if "bidi_responses" in frame.filename:
            site = f"{_short(frame.filename)}:{frame.lineno}"
            return site if frame is inner else f"{site} > {here}"
    return here


def _short(filename: str) -> str:
    for marker in ("bidi_responses/", "site-packages/", "python3.11/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


async def _client(transport: str, port: int, n: int) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CLIENT,
        transport,
        str(port),
        str(n),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 120)
    if line.strip() != b"ready":
        raise RuntimeError(f"client failed: {line!r}")
    return proc


async def _release(proc: asyncio.subprocess.Process) -> None:
    assert proc.stdin is not None
    proc.stdin.write(b"\n")
    await proc.stdin.drain()
    await asyncio.wait_for(proc.wait(), 60)


def _file(site: str) -> str:
    """A site's project file (or library module), without line numbers."""
    outer = site.split(" > ", 1)[0]
    return outer.rsplit(":", 1)[0]


async def run(transport: str, streams: int, top: int, data_dir: Path, by: str) -> None:
    from bidi_responses.server.app import start_server

    from .servers import fast_sim, sim_server_config

    config = sim_server_config(data_dir, fast_sim(tool_rounds=0, answer_tokens=10))
    running = await start_server(config, http=True)
    port = running.http_port if transport == "websocket" else running.grpc_port
    assert port is not None
    try:
        # A first round loads what is loaded once per process (imports, caches, pools).
        await _release(await _client(transport, port, 5))
        await asyncio.sleep(0.5)  # the closed streams' cleanup runs (not synchronization)
        tracemalloc.start(30)
        gc.collect()
        before = tracemalloc.take_snapshot()
        proc = await _client(transport, port, streams)
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        await _release(proc)
    finally:
        await running.stop(grace=0)
    sites: dict[str, int] = defaultdict(int)
    total = 0
    for stat in after.compare_to(before, "traceback"):
        site = _site(stat.traceback)
        sites[_file(site) if by == "file" else site] += stat.size_diff
        total += stat.size_diff
    print(f"{transport}: {streams} idle open streams, {total / streams / 1024:.1f} KiB each")
    for site, size in sorted(sites.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {size / streams:9.0f} B  {site}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=("websocket", "connect"), default="websocket")
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument(
        "--by", choices=("file", "line"), default="file", help="group by file or by line"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    with tempfile.TemporaryDirectory() as data_dir:
        asyncio.run(run(args.transport, args.streams, args.top, Path(data_dir), args.by))


if __name__ == "__main__":
    main()
