"""``bidi-responses serve --workers 2`` as a user runs it: shared ports, store, ledger, log."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import aiohttp
import grpc
from bidi_responses.client import AsyncResponsesClient
from bidi_responses.server.core.storage.sqlite_schema import read_ledger

from tests.pipeline.server_process import FAST_FLAGS, ServerLog


def _own_connection_client(port: int) -> AsyncResponsesClient:
    """A client with its own TCP connection (grpc shares connections between channels with
    the same target unless told not to)."""
    channel = grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=(("grpc.use_local_subchannel_pool", 1),)
    )
    return AsyncResponsesClient(channel=channel)


async def _stats_via_new_connection(port: int) -> dict[str, int]:
    # A new channel is a new TCP connection, which the kernel hands to one of the workers.
    async with _own_connection_client(port) as client:
        stats = await client.stats()
    return {k: int(stats[k]) for k in ("worker_index", "workers", "worker_pid")}


async def _client_on_worker(port: int, index: int) -> AsyncResponsesClient:
    """A client whose connection landed on worker ``index`` (bounded tries)."""
    for _ in range(200):
        client = _own_connection_client(port)
        if int((await client.stats())["worker_index"]) == index:
            return client
        await client.close()
    raise AssertionError(f"no connection reached worker {index} in 200 tries")


async def test_two_workers_share_ports_store_ledger_and_log(tmp_path: Path) -> None:
    data = tmp_path / "data"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bidi_responses.server.cli",
        "serve",
        "--workers",
        "2",
        "--grpc-port",
        "0",
        "--http-port",
        "0",
        "--data-dir",
        str(data),
        *FAST_FLAGS,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,  # so that cleanup can stop the workers with it
    )
    log = ServerLog(process)
    try:
        async with asyncio.timeout(90):
            line = await log.wait_for("listening")
            match = re.search(r"gRPC on 127\.0\.0\.1:(\d+), .*http://127\.0\.0\.1:(\d+)/v1", line)
            assert match, line
            assert "2 workers" in line
            grpc_port, http_port = int(match[1]), int(match[2])

            # Both workers answer on the same gRPC port, and on the same HTTP port.
            seen: dict[int, int] = {}
            for _ in range(200):
                stats = await _stats_via_new_connection(grpc_port)
                assert stats["workers"] == 2
                seen[stats["worker_index"]] = stats["worker_pid"]
                if len(seen) == 2:
                    break
            assert sorted(seen) == [0, 1] and len(set(seen.values())) == 2
            http_seen: set[int] = set()
            for _ in range(200):
                connector = aiohttp.TCPConnector(force_close=True)
                async with (
                    aiohttp.ClientSession(connector=connector) as session,
                    session.get(f"http://127.0.0.1:{http_port}/v1/stats") as reply,
                ):
                    http_seen.add(int((await reply.json())["worker_index"]))
                if len(http_seen) == 2:
                    break
            assert http_seen == {0, 1}

            # A stream stays in its process: its cache serves the continuation. A stored
            # response written by worker 0 is readable, and continuable, through worker 1
            # as soon as its terminal event has arrived.
            first = await _client_on_worker(grpc_port, 0)
            second = await _client_on_worker(grpc_port, 1)
            try:
                async with first.connect() as stream:
                    one = await stream.create(model="sim-model", input="hi", store=True)
                    two = await stream.create(
                        model="sim-model",
                        input=[
                            {
                                "type": "function_call_output",
                                "call_id": c["call_id"],
                                "output": "ok",
                            }
                            for c in one.function_calls
                        ]
                        or "more",
                        previous_response_id=one.id,
                        store=True,
                    )
                    assert two.usage is not None and two.usage.cached_tokens > 0
                assert (await second.get(two.id)).id == two.id
                three = await second.create(
                    model="sim-model", input="go on", previous_response_id=two.id, store=False
                )
                assert three.status == "completed"
            finally:
                await first.close()
                await second.close()

        # One clean shutdown: SIGTERM to the supervisor stops every worker.
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            assert await process.wait() == 0
        for pid in seen.values():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            raise AssertionError(f"worker {pid} still running")
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
        await log.close()

    # One log: both workers and the supervisor wrote to it.
    text = str(log)
    assert "[worker 0]" in text and "[worker 1]" in text and "[supervisor]" in text
    assert text.count("listening") == 1
    # One ledger: a row for each of the three responses, whichever worker served it.
    rows = {row.response_id: row for row in read_ledger(data / "responses.db")}
    assert {one.id, two.id, three.id} <= set(rows)


async def test_workers_must_be_positive(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bidi_responses.server.cli",
        "serve",
        "--workers",
        "0",
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        _, err = await process.communicate()
    assert process.returncode == 2
    assert b"--workers" in err
