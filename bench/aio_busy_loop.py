"""grpc.aio's writes on a busy event loop, with none of this project's code: a reproducer.

A bare grpc.aio server streams ``--writes`` small messages on each of ``--streams`` calls from
a client in another process, ``--gap-ms`` apart, and times every ``context.write`` until it
completes. Beside it, on the server's event loop, ``--burners`` coroutines each burn
``--burn-ms`` of CPU and then sleep ``--nap-ms`` (a timer), as a token-paced engine keeps a
loop busy. A task that sleeps 1 ms at a time measures how late the loop comes back to it.

What it shows on a 2-vCPU VM: with 30 burners of 0.1 ms per 1 ms nap, about 9% of the writes
take ~230 ms, on most of the streams, in bursts about three times a second, while a 1 ms timer
fires at most ~4 ms late. The client receives nothing during a burst. The cause is grpc.aio's
hand-over of completions to the loop: a byte per completion written to a socket pair, one byte
read per turn of the loop. On a busy loop the bytes pile up until the pair is full and grpc's
poller thread blocks, and with it every completion (``codec/aio_wakeups.py``).
``--drain-wakeups`` runs the server with this project's remedy, which reads the waiting bytes
at once: every write then completes within a few milliseconds.

    python -m bidi_responses.bench.aio_busy_loop --streams 100 --burners 30 [--drain-wakeups]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

import grpc

from .ports import free_port
from .stats import median, percentile

__all__ = ["Settings", "main", "measure"]

_METHOD = "/bench.BusyLoop/Stream"
_SERVICE, _NAME = "bench.BusyLoop", "Stream"


@dataclass(frozen=True, slots=True)
class Settings:
    """One run: the streams, their writes, and the load beside them on the server's loop."""

    streams: int = 100
    writes: int = 10
    gap_ms: float = 10.0
    burners: int = 30
    burn_ms: float = 0.1
    nap_ms: float = 1.0
    #: Run the server with grpc.aio's completion wake-ups drained (the project's remedy).
    drain_wakeups: bool = False


@dataclass(slots=True)
class _Timings:
    writes_s: list[float]
    slow_streams: int  # streams with a write over 100 ms
    turns_s: list[float]  # how late a 1 ms timer fired, each time


async def _serve(settings: Settings, port: int, ready: Connection) -> _Timings:
    """The server until every stream has ended; the writes' and the loop turns' timings."""
    writes: list[float] = []
    turns: list[float] = []
    ended = asyncio.Event()
    done = slow = 0

    async def stream(request_iterator: AsyncIterator[bytes], context: Any) -> None:
        nonlocal done, slow
        slowest = 0.0
        try:
            message = await context.read()
            for _ in range(settings.writes):
                started = time.perf_counter()
                await context.write(message)
                took = time.perf_counter() - started
                writes.append(took)
                slowest = max(slowest, took)
                await asyncio.sleep(settings.gap_ms / 1000)
            await context.read()  # the client's half-close
        finally:
            slow += slowest > 0.1
            done += 1
            if done == settings.streams:
                ended.set()

    async def burner() -> None:
        while True:
            until = time.perf_counter() + settings.burn_ms / 1000
            while time.perf_counter() < until:
                pass
            await asyncio.sleep(settings.nap_ms / 1000)

    async def turn_clock() -> None:
        # How late a 1 ms timer fires: how long the loop takes to come back to a task.
        while True:
            started = time.perf_counter()
            await asyncio.sleep(0.001)
            turns.append(time.perf_counter() - started - 0.001)

    server = grpc.aio.server()
    handler: grpc.RpcMethodHandler[bytes, bytes] = grpc.stream_stream_rpc_method_handler(stream)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(_SERVICE, {_NAME: handler}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    if settings.drain_wakeups:
        from bidi_responses.codec.aio_wakeups import drain_completion_wakeups

        if not drain_completion_wakeups():
            raise RuntimeError("grpc.aio's completion wake-ups could not be drained")
    load = [asyncio.create_task(burner()) for _ in range(settings.burners)]
    load.append(asyncio.create_task(turn_clock()))
    ready.send(True)
    try:
        await ended.wait()
    finally:
        for task in load:
            task.cancel()
        await asyncio.gather(*load, return_exceptions=True)
        await server.stop(None)
    return _Timings(writes, slow, turns)


def _server_process(settings: Settings, port: int, ready: Connection, out: Connection) -> None:
    timings = asyncio.run(_serve(settings, port, ready))
    out.send(asdict(timings))


async def _client(settings: Settings, port: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await channel.channel_ready()
        call_method: grpc.aio.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(
            _METHOD
        )

        async def one() -> None:
            finished = asyncio.Event()

            async def requests() -> AsyncIterator[bytes]:
                yield b"x"
                await finished.wait()

            call = call_method(requests())
            received = 0
            async for _ in call:
                received += 1
                if received == settings.writes:
                    break
            finished.set()
            await call.code()  # the server ends the call once the client half-closed

        await asyncio.gather(*(one() for _ in range(settings.streams)))


def measure(settings: Settings, timeout_s: float = 120.0) -> dict[str, float]:
    """Run the server in its own process and the client here; the summary figures."""
    port = free_port()
    context = multiprocessing.get_context("spawn")
    ready_in, ready_out = context.Pipe(duplex=False)
    result_in, result_out = context.Pipe(duplex=False)
    server = context.Process(target=_server_process, args=(settings, port, ready_out, result_out))
    server.start()
    try:
        if not ready_in.poll(timeout_s):
            raise RuntimeError("the server did not start")
        ready_in.recv()
        asyncio.run(asyncio.wait_for(_client(settings, port), timeout_s))
        if not result_in.poll(timeout_s):
            raise RuntimeError("the server did not report")
        timings = _Timings(**result_in.recv())
    finally:
        server.join(timeout_s)
        if server.is_alive():
            server.kill()
    writes_ms = [w * 1000 for w in timings.writes_s]
    turns_ms = [t * 1000 for t in timings.turns_s]
    return {
        "writes": len(writes_ms),
        "write_p50_ms": median(writes_ms),
        "write_p99_ms": percentile(writes_ms, 99),
        "write_max_ms": max(writes_ms),
        "slow_writes": sum(1 for w in writes_ms if w > 100),
        "slow_streams": timings.slow_streams,
        "timer_late_p50_ms": median(turns_ms),
        "timer_late_max_ms": max(turns_ms),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Settings()
    for field, value in asdict(defaults).items():
        flag = f"--{field.replace('_', '-')}"
        if isinstance(value, bool):
            parser.add_argument(flag, action="store_true")
        else:
            parser.add_argument(flag, type=type(value), default=value)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    settings = Settings(**{k: getattr(args, k) for k in asdict(defaults)})
    figures = measure(settings)
    if args.json:
        print(json.dumps(figures))
    else:
        print(
            f"{settings.streams} streams x {settings.writes} writes beside {settings.burners} "
            f"burners ({settings.burn_ms:g} ms of CPU per {settings.nap_ms:g} ms nap"
            f"{', wake-ups drained' if settings.drain_wakeups else ''}): write p50 "
            f"{figures['write_p50_ms']:.2f} ms, p99 {figures['write_p99_ms']:.2f}, max "
            f"{figures['write_max_ms']:.2f}; {figures['slow_writes']:.0f} writes over 100 ms, on "
            f"{figures['slow_streams']:.0f} streams; a 1 ms timer late by p50 "
            f"{figures['timer_late_p50_ms']:.2f} ms, max {figures['timer_late_max_ms']:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
