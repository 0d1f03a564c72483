"""Heavy memory runs (``make faults``): many idle large caches under a global budget, and 40
clients that never read. The server is a subprocess; its RSS is read from /proc."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from bidi_responses.bench.ports import free_port
from bidi_responses.client import AsyncResponsesClient, ResponsesError
from bidi_responses.client.channel import CHANNEL_OPTIONS

from tests.faults.slow_clients import StalledGrpc, StalledWebSocket, big_creates
from tests.pipeline.server_process import FAST_FLAGS, serve_process
from tests.workload import tool_output

MIB = 1024 * 1024


def rss_bytes(pid: int) -> tuple[int, int]:
    """Resident and peak resident bytes of a process."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            fields[key] = value.split()
    return int(fields["VmRSS"][0]) * 1024, int(fields["VmHWM"][0]) * 1024


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.timeout(3600)
async def test_2000_streams_of_100k_tokens_under_a_256_mb_budget(tmp_path: Path) -> None:
    budget_mb = 256
    streams_n = 2000
    async with asyncio.timeout(3600):
        base_text = tool_output(100_000, seed=7)
        args = (*FAST_FLAGS, "--cache-budget-mb", str(budget_mb))
        async with (
            serve_process(tmp_path / "data", args=args) as (process, port, _),
            AsyncResponsesClient(f"127.0.0.1:{port}") as client,
            contextlib.AsyncExitStack() as open_streams,
        ):
            # One small turn first, so the baseline has every import and buffer warmed.
            await client.create(model="sim-model", input="warm up", store=False)
            baseline, _ = rss_bytes(process.pid)
            # 100 streams per connection (the default per-connection limit), as separate
            # agents' clients would have: each client on a connection of its own (grpc would
            # otherwise share one connection between channels to the same target).
            channels = [
                await open_streams.enter_async_context(
                    AsyncResponsesClient(
                        channel=grpc.aio.insecure_channel(
                            f"127.0.0.1:{port}",
                            options=[*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)],
                        )
                    )
                )
                for _ in range(streams_n // 100)
            ]
            streams: list[Any] = []
            first_ids: list[str] = []
            started = time.perf_counter()
            for batch in range(0, streams_n, 20):
                # Each stream opens just before its first turn, as an agent's would.
                opened = [
                    await open_streams.enter_async_context(channels[n % len(channels)].connect())
                    for n in range(batch, min(batch + 20, streams_n))
                ]
                streams.extend(opened)
                replies = await asyncio.gather(
                    *(
                        stream.create(
                            model="sim-model",
                            input=f"stream {batch + i}\n{base_text}",
                            generate=False,
                            store=False,
                        )
                        for i, stream in enumerate(opened)
                    )
                )
                first_ids.extend(r.id for r in replies)
            filled_s = time.perf_counter() - started
            rss, peak = rss_bytes(process.pid)
            stats = await client.stats()
            tokens = replies[-1].usage.input_tokens if replies[-1].usage else 0
            # The oldest streams were evicted; the newest continue from their caches.
            with pytest.raises(ResponsesError) as missing:
                await streams[0].create(
                    model="sim-model", previous_response_id=first_ids[0], input="next"
                )
            assert missing.value.code == "previous_response_not_found"
            last = await streams[-1].create(
                model="sim-model", previous_response_id=first_ids[-1], input="next"
            )
            assert last.stats["tokens_reused"] > 0
        figures = {
            "streams": streams_n,
            "tokens_per_stream": tokens,
            "budget_mb": budget_mb,
            "baseline_rss_mb": round(baseline / MIB, 1),
            "rss_after_mb": round(rss / MIB, 1),
            "peak_rss_mb": round(peak / MIB, 1),
            "over_baseline_mb": round((rss - baseline) / MIB, 1),
            "over_budget_per_stream_kib": round(
                (rss - baseline - budget_mb * MIB) / streams_n / 1024
            ),
            "cache": stats["cache"],
            "fill_s": round(filled_s, 1),
        }
        print(f"\nFAULTS memory budget: {figures}")
        assert stats["cache"]["bytes_used"] <= budget_mb * MIB
        # Budget plus a stated overhead of 192 MiB: 2,000 open streams (about 80 KiB each:
        # session, lanes, their tasks, HTTP/2 state) and the turns in flight.
        assert rss <= baseline + budget_mb * MIB + 192 * MIB, figures


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.timeout(600)
async def test_40_never_reading_clients_are_cut_off_and_memory_stays_bounded(
    tmp_path: Path,
) -> None:
    write_timeout = 5.0
    lanes = 3  # 3 x 2 x 1 MiB of events per client: more than the socket buffers hold
    waves = 2  # a second wave must reuse the memory of the first, not add to it
    async with asyncio.timeout(600):
        http_port = free_port()
        args = (*FAST_FLAGS, "--write-timeout-s", str(write_timeout))
        async with (
            serve_process(tmp_path / "data", args=args, http_port=http_port) as (process, port, _),
            AsyncResponsesClient(f"127.0.0.1:{port}") as client,
        ):
            await client.create(model="sim-model", input="warm up", store=False)
            baseline, _ = rss_bytes(process.pid)
            per_wave: list[dict[str, Any]] = []
            for number in range(1, waves + 1):
                per_wave.append(
                    await _never_reading_wave(
                        client, process.pid, port, http_port, 40 * number, lanes
                    )
                )
                # The server returns what the wave freed once it is idle (the idle trimmer,
                # `trim_memory_idle_s`): glibc keeps freed pages in per-thread arenas, and the
                # next wave's buffers may be allocated in another thread's arena.
                await _until_memory_returned(client, process.pid, baseline)
            stats = await client.stats()
        figures = {
            "clients_per_wave": 40,
            "waves": waves,
            "write_timeout_s": write_timeout,
            "baseline_rss_mb": round(baseline / MIB, 1),
            "per_wave": per_wave,
            "write_timeouts_total": stats["write_timeouts_total"],
        }
        print(f"\nFAULTS never-reading clients: {figures}")
        # Each was cut off with its status; the second wave reused most of the first's memory.
        for wave in per_wave:
            assert wave["grpc_outcomes"] == ["StatusCode.RESOURCE_EXHAUSTED"], figures
            assert wave["ws_outcomes"] == [1008], figures
        assert stats["write_timeouts_total"] == 40 * waves
        assert per_wave[1]["max_rss_mb"] <= per_wave[0]["max_rss_mb"] * 1.3, figures


async def _until_memory_returned(client: AsyncResponsesClient, pid: int, baseline: int) -> None:
    """Wait until every stream of the wave is closed and the server's RSS is back within
    128 MiB of ``baseline`` (bounded by the test's timeout)."""
    while True:
        if not (await client.stats())["streams_open"] and rss_bytes(pid)[0] <= baseline + 128 * MIB:
            return
        await asyncio.sleep(0.2)


async def _never_reading_wave(
    client: AsyncResponsesClient, pid: int, port: int, http_port: int, cut_total: int, lanes: int
) -> dict[str, Any]:
    """20 gRPC and 20 WebSocket clients that send and never read, until all are cut off."""
    grpc_clients = [StalledGrpc(port) for _ in range(20)]
    ws_clients = [await StalledWebSocket.open(http_port) for _ in range(20)]
    samples: list[int] = []
    sampling = asyncio.Event()

    async def sample() -> None:
        while not sampling.is_set():
            samples.append(rss_bytes(pid)[0])
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.2):
                    await sampling.wait()

    async def stalled(stalled_client: StalledGrpc | StalledWebSocket) -> float:
        await stalled_client.send(big_creates(lanes))
        return time.perf_counter()

    sampler = asyncio.ensure_future(sample())
    started = time.perf_counter()
    stalled_clients: list[StalledGrpc | StalledWebSocket] = [*grpc_clients, *ws_clients]
    sent = max(await asyncio.gather(*(stalled(c) for c in stalled_clients)))
    # Read nothing until the server has cut every client off (the fault itself).
    while True:
        if (await client.stats())["write_timeouts_total"] >= cut_total:
            break
        await asyncio.sleep(0.1)
    all_cut = time.perf_counter()
    grpc_outcomes = await asyncio.gather(*(c.outcome() for c in grpc_clients))
    ws_outcomes = await asyncio.gather(*(c.outcome() for c in ws_clients))
    sampling.set()
    await sampler
    final, _ = rss_bytes(pid)
    for c in grpc_clients:
        await c.close()
    for w in ws_clients:
        await w.close()
    return {
        "sending_s": round(sent - started, 2),
        "last_send_to_all_cut_off_s": round(all_cut - sent, 2),
        "grpc_outcomes": sorted({str(code) for code, _ in grpc_outcomes}),
        "ws_outcomes": sorted({code for code, _ in ws_outcomes}),
        "max_rss_mb": round(max(samples) / MIB, 1),
        "rss_after_mb": round(final / MIB, 1),
    }
