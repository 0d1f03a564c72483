"""The data directory runs out of space: bounded, loud, and self-healing.

The server is a subprocess whose file size limit (``RLIMIT_FSIZE``, set before it starts)
stops its database and journal files from growing past a few hundred KiB, as a full disk
would; Python ignores SIGXFSZ, so writes fail with EFBIG. Agents that store nothing loop the
whole time. Once the store fails, new ``store: true`` work must get a clean 503
``storage_unavailable`` (HTTP) / error event (gRPC), the cause must be logged once, and the
non-storing agents must go on without a stall. Then the limit is lifted (space returns) and
the server must recover by itself: ``store: true`` works again, and every response a client
saw complete, including those finished during the outage, ends up in the ledger.
"""

from __future__ import annotations

import asyncio
import resource
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from bidi_responses.bench.ports import free_port
from bidi_responses.client import AsyncResponsesClient, ResponsesError
from bidi_responses.server.core.storage.sqlite_schema import read_ledger

from tests.conftest import until
from tests.pipeline.server_process import FAST_FLAGS, serve_process

BIG_INPUT = "stored conversation text " * 800  # ~20 KB per stored response


def _file_size_limit(limit: int) -> Callable[[], None]:
    def apply() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))

    return apply


@dataclass(slots=True)
class Traffic:
    """Completions seen by clients, and the slowest turn of the agents that store nothing."""

    completed: set[str] = field(default_factory=set)
    slowest_s: float = 0.0
    turns: int = 0
    during_outage: int = 0
    outage: bool = False


async def _unstored_agent(port: int, n: int, traffic: Traffic, stop: asyncio.Event) -> None:
    """Turns with ``store: false`` until ``stop``; any error or hang fails the test."""
    async with AsyncResponsesClient(f"127.0.0.1:{port}") as client, client.connect() as stream:
        previous: str | None = None
        while not stop.is_set():
            started = time.perf_counter()
            async with asyncio.timeout(20):  # a stall fails here
                response = await stream.create(
                    model="sim-model",
                    input=f"agent {n} turn {traffic.turns}",
                    store=False,
                    previous_response_id=previous,
                )
            traffic.slowest_s = max(traffic.slowest_s, time.perf_counter() - started)
            assert response.status == "completed", response
            traffic.completed.add(response.id)
            traffic.turns += 1
            traffic.during_outage += traffic.outage
            previous = response.id
            await asyncio.sleep(0)


async def _store_until_refused(client: AsyncResponsesClient, traffic: Traffic) -> str:
    """Stored creates until storage says it is unavailable; returns how it said so."""
    for _ in range(10_000):
        try:
            response = await client.create(model="sim-model", input=BIG_INPUT, store=True)
        except ResponsesError as error:
            assert error.code == "storage_unavailable", error
            return "refused"
        if response.status == "failed":
            # In flight when the journal broke: failed, never reported completed.
            assert response.error is not None
            assert response.error["code"] == "storage_unavailable", response.error
            return "failed"
        traffic.completed.add(response.id)
    raise AssertionError("storage never filled up")


async def run_disk_full(data: Path, *, agents: int, limit: int) -> dict[str, float | int | str]:
    """One outage and recovery under load; returns the figures."""
    http_port = free_port()
    traffic = Traffic()
    stop = asyncio.Event()
    async with serve_process(
        data, args=FAST_FLAGS, http_port=http_port, preexec_fn=_file_size_limit(limit)
    ) as (process, port, log):
        runners = [
            asyncio.ensure_future(_unstored_agent(port, n, traffic, stop)) for n in range(agents)
        ]
        async with (
            AsyncResponsesClient(f"127.0.0.1:{port}") as client,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", timeout=20) as http,
        ):
            first_refusal = await _store_until_refused(client, traffic)
            traffic.outage = True
            outage_started = time.perf_counter()
            # Every transport refuses stored work cleanly while the disk is full.
            refused = 0
            for _ in range(20):
                reply = await http.post(
                    "/v1/responses", json={"model": "sim-model", "input": "x", "store": True}
                )
                assert reply.status_code == 503, reply.text
                assert reply.json()["error"]["code"] == "storage_unavailable"
                refused += 1
                with pytest.raises(ResponsesError) as caught:
                    await client.create(model="sim-model", input="x", store=True)
                assert caught.value.code == "storage_unavailable"
                refused += 1
            # Work that stores nothing still runs, over HTTP too.
            reply = await http.post(
                "/v1/responses", json={"model": "sim-model", "input": "x", "store": False}
            )
            assert reply.status_code == 200, reply.text
            traffic.completed.add(reply.json()["id"])
            turns_at = traffic.turns
            await until(lambda: traffic.turns >= turns_at + 4 * agents)

            # Space returns: the server notices by itself.
            resource.prlimit(
                process.pid,
                resource.RLIMIT_FSIZE,
                (resource.RLIM_INFINITY, resource.RLIM_INFINITY),
            )
            space_returned = time.perf_counter()
            recovered_at = 0.0
            async with asyncio.timeout(60):
                while True:
                    try:
                        response = await client.create(model="sim-model", input="after", store=True)
                    except ResponsesError as error:
                        assert error.code == "storage_unavailable"
                        await asyncio.sleep(0.05)
                        continue
                    if response.status == "completed":
                        recovered_at = time.perf_counter()
                        traffic.completed.add(response.id)
                        break
            traffic.outage = False
            stored = await client.get(response.id)
            assert stored.id == response.id
            stop.set()
            await asyncio.gather(*runners)
        process.send_signal(signal.SIGTERM)
        assert await process.wait() == 0, str(log)
    lines = [line for line in log.lines if "storage unavailable" in line]
    # Logged once per broken component (journal, database), not once per refused request.
    assert 1 <= len(lines) <= 4, lines
    assert any("storage recovered" in line for line in log.lines)
    ledger = {row.response_id for row in read_ledger(data / "responses.db")}
    assert traffic.completed <= ledger, len(traffic.completed - ledger)
    return {
        "agents": agents,
        "file_size_limit_bytes": limit,
        "first_refusal": first_refusal,
        "refused_503": refused,
        "unstored_turns_total": traffic.turns,
        "unstored_turns_during_outage": traffic.during_outage,
        "slowest_unstored_turn_s": round(traffic.slowest_s, 3),
        "outage_s": round(recovered_at - outage_started, 3),
        "space_returned_to_recovery_s": round(recovered_at - space_returned, 3),
        "log_lines_storage_unavailable": len(lines),
        "acknowledged_in_ledger": len(traffic.completed),
    }


async def test_disk_full_refuses_stored_work_and_recovers(tmp_path: Path) -> None:
    async with asyncio.timeout(120):
        figures = await run_disk_full(tmp_path / "data", agents=4, limit=512 * 1024)
        during_outage = figures["unstored_turns_during_outage"]
        assert isinstance(during_outage, int) and during_outage > 0, figures


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.timeout(3600)
async def test_disk_full_under_load(tmp_path: Path) -> None:
    async with asyncio.timeout(600):
        figures = await run_disk_full(tmp_path / "data", agents=50, limit=2 * 1024 * 1024)
        print(f"\nFAULTS disk full: {figures}")
