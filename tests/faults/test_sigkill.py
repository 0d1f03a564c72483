"""SIGKILL under load, then a restart: nothing a client saw complete is lost or doubled.

The server runs as users run it, a ``bidi-responses serve`` subprocess, and is killed with
SIGKILL (no handler, no drain) at a random moment while many agents loop over Connect streams;
half of them store their responses. After each restart (which replays the journal), every
response whose ``response.completed`` reached a client must have exactly one ledger row, and
the stored ones must be retrievable and continuable. The smoke version runs in ``make test``;
the heavy one (20 kills under 100 streams) in ``make faults``.
"""

from __future__ import annotations

import asyncio
import random
import re
import signal
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import grpc
import pytest
from bidi_responses.client import AsyncResponsesClient, ResponsesError
from bidi_responses.server.core.storage.sqlite_schema import read_ledger

from tests.conftest import SHELL_TOOL, until
from tests.pipeline.server_process import FAST_FLAGS, serve_process
from tests.workload import tool_output


@dataclass(slots=True)
class Seen:
    """What the clients were told: completed response ids, whether stored, last id per agent."""

    completed: dict[str, bool] = field(default_factory=dict)
    last: dict[int, str] = field(default_factory=dict)


async def _agent(port: int, n: int, seen: Seen, stop: asyncio.Event) -> None:
    """Loop tool turns until the server dies (or ``stop``); record each completion seen."""
    store = n % 2 == 0
    async with AsyncResponsesClient(f"127.0.0.1:{port}") as client, client.connect() as stream:
        try:
            response = await stream.create(
                model="sim-model", input=f"agent {n}: fix it", tools=[SHELL_TOOL], store=store
            )
            turn = 0
            while not stop.is_set():
                assert response.status == "completed", response
                seen.completed[response.id] = store
                seen.last[n] = response.id
                turn += 1
                response = await stream.create(
                    model="sim-model",
                    previous_response_id=response.id,
                    tools=[SHELL_TOOL],
                    store=store,
                    input=[response.call_output(tool_output(60, seed=n * 1000 + turn))],
                )
        except (ResponsesError, grpc.aio.AioRpcError):
            return  # the server died under us


def _reached(completed: dict[str, bool], count: int) -> bool:
    return len(completed) >= count


def _ledger_ids(db: Path) -> list[str]:
    return [row.response_id for row in read_ledger(db)]


async def _check(port: int, db: Path, seen: Seen, stored_agents: list[int]) -> None:
    """After a restart: every completion seen is in the ledger once, stored ones continuable."""
    ids = _ledger_ids(db)
    assert len(ids) == len(set(ids))
    missing = set(seen.completed) - set(ids)
    assert not missing, f"{len(missing)} acknowledged responses missing from the ledger"
    stored = [rid for rid, store in seen.completed.items() if store]
    async with AsyncResponsesClient(f"127.0.0.1:{port}") as client:
        fetched = await asyncio.gather(*(client.get(rid) for rid in stored))
        assert [r.id for r in fetched] == stored
        async with client.connect() as stream:
            for n in stored_agents:
                last = await client.get(seen.last[n])
                nxt = await stream.create(
                    model="sim-model",
                    previous_response_id=last.id,
                    tools=[SHELL_TOOL],
                    input=[last.call_output("ok")],
                    # One conversation after another on the default lane: a stream takes at
                    # most 32 named lanes, and each create names what it continues.
                )
                assert nxt.status == "completed"


async def run_kills(
    data: Path, *, kills: int, streams: int, seed: int = 0, args: tuple[str, ...] = FAST_FLAGS
) -> dict[str, int]:
    """``kills`` rounds of load-then-SIGKILL on one data directory, each checked on restart."""
    rng = random.Random(seed)
    seen = Seen()
    total_seen = 0
    total_stored = 0
    replayed = 0
    for round_ in range(kills + 1):
        async with serve_process(data, args=args) as (process, port, log):
            if round_:
                for line in log.lines:
                    found = re.search(r"replayed (\d+) post-inference jobs", line)
                    replayed += int(found.group(1)) if found else 0
                stored_agents = [n for n in seen.last if n % 2 == 0]
                await _check(port, data / "responses.db", seen, stored_agents)
            if round_ == kills:
                break
            seen = Seen()
            stop = asyncio.Event()
            agents = [asyncio.ensure_future(_agent(port, n, seen, stop)) for n in range(streams)]
            # A random moment: after a random number of completions.
            threshold = rng.randint(streams, streams * 6)
            await until(partial(_reached, seen.completed, threshold))
            process.send_signal(signal.SIGKILL)
            await process.wait()
            await asyncio.gather(*agents)
            total_seen += len(seen.completed)
            total_stored += sum(seen.completed.values())
    return {
        "kills": kills,
        "streams": streams,
        "acknowledged": total_seen,
        "acknowledged_stored": total_stored,
        "replayed_records": replayed,
        "lost": 0,
    }


async def test_sigkill_under_load_loses_nothing_acknowledged(tmp_path: Path) -> None:
    async with asyncio.timeout(90):
        figures = await run_kills(tmp_path / "data", kills=2, streams=12)
        assert figures["acknowledged_stored"] > 0
        assert figures["replayed_records"] > 0  # the kill did leave work to the journal


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.timeout(3600)
async def test_sigkill_20_times_under_100_streams(tmp_path: Path) -> None:
    async with asyncio.timeout(1800):
        figures = await run_kills(tmp_path / "data", kills=20, streams=100, seed=1)
        print(f"\nFAULTS sigkill: {figures}")
