"""Post-inference work runs off the critical path, with backpressure, and loses nothing.

The store here is instrumented: its writes wait on an event that the test sets only after the
next turn has produced its first token. The turn can only have started if nothing on its path
waited for the earlier write, which proves the point without measuring time.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from bidi_responses.client import AsyncResponsesClient
from bidi_responses.server.app import RunningServer
from bidi_responses.server.core.api.errors import ApiError
from bidi_responses.server.core.storage.journal import Journal
from bidi_responses.server.core.storage.postinference import PostJob, PostQueue
from bidi_responses.server.core.storage.sqlite_store import Store
from bidi_responses.server.core.storage.store import LedgerRow, StoredResponse

from tests.conftest import SHELL_TOOL, ServerFactory, make_config, until

FIRST_TOKEN = ("response.output_text.delta", "response.function_call_arguments.delta")
Jobs = list[tuple[StoredResponse | None, LedgerRow | None]]
WriteMany = Callable[[Jobs], Awaitable[None]]


def _gate_writes(running: RunningServer) -> tuple[asyncio.Event, list[str]]:
    """Make the server's SQLite writes wait for the returned event; lists writes begun."""
    store = running.core.deps.store
    real: WriteMany = store.write_many
    gate = asyncio.Event()
    begun: list[str] = []

    async def gated(jobs: Jobs) -> None:
        begun.extend(ledger.response_id if ledger else "?" for _, ledger in jobs)
        await gate.wait()
        await real(jobs)

    store.write_many = gated  # type: ignore[method-assign]
    return gate, begun


def _ledger(path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT response_id, status FROM usage_ledger").fetchall()


async def test_next_turn_starts_before_the_previous_write_lands(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    async with asyncio.timeout(30):
        config = make_config(tmp_path, tool_rounds=10)
        config.durability.write_linger_ms = 0  # the write begins at once (and waits)
        running = await server_factory(config)
        post = running.core.deps.post
        gate, begun = _gate_writes(running)
        async with (
            AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client,
            client.connect() as stream,
        ):
            first = await stream.create(model="sim-model", input="go", tools=[SHELL_TOOL])
            # The terminal event arrived; its job is queued, its write not done.
            assert post.written == 0
            events = stream.create_events(
                model="sim-model",
                previous_response_id=first.id,
                tools=[SHELL_TOOL],
                input=[first.call_output("ok")],
            )
            kinds = []
            async for event in events:
                kinds.append(event["type"])
                if event["type"] in FIRST_TOKEN:
                    # The next turn's first token, while turn 1's write still waits.
                    assert post.written == 0 and begun == [first.id]
                    gate.set()
                if event["type"] == "response.completed":
                    second = event["response"]
            assert set(kinds) & set(FIRST_TOKEN)
            # Stored responses are readable before their write lands (staged).
            fetched = await client.get(first.id)
            assert fetched.id == first.id
            await post.join()
        assert post.written == 2 and post.failed == 0
        rows = dict(_ledger(running.core.config.store_path))
        assert rows == {first.id: "completed", second["id"]: "completed"}


def _count_batches(running: RunningServer) -> list[list[str]]:
    """The response ids of each SQLite write the server makes, one list per transaction."""
    store = running.core.deps.store
    real: WriteMany = store.write_many
    batches: list[list[str]] = []

    async def counted(jobs: Jobs) -> None:
        batches.append([ledger.response_id for _, ledger in jobs if ledger is not None])
        await real(jobs)

    store.write_many = counted  # type: ignore[method-assign]
    return batches


async def test_journaled_turns_linger_into_one_transaction(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    """With a linger longer than the test, the turns of a loop are acknowledged (durable in
    the journal) and readable without any SQLite write; ``join`` ends the linger, and one
    transaction takes them all."""
    async with asyncio.timeout(30):
        config = make_config(tmp_path, tool_rounds=10)
        config.durability.write_linger_ms = 600_000
        running = await server_factory(config)
        post = running.core.deps.post
        batches = _count_batches(running)
        async with AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client:
            ids: list[str] = []
            async with client.connect() as stream:
                response = await stream.create(model="sim-model", input="go", tools=[SHELL_TOOL])
                ids.append(response.id)
                for _ in range(3):
                    response = await stream.create(
                        model="sim-model",
                        previous_response_id=response.id,
                        tools=[SHELL_TOOL],
                        input=[response.call_output("ok")],
                    )
                    assert response.status == "completed"
                    ids.append(response.id)
            assert batches == [] and post.written == 0
            assert post.journal is not None and post.journal.appended == 4
            assert (await client.get(ids[0])).id == ids[0]  # staged: readable before its write
            await post.join()
        assert batches == [ids] and post.written == 4
        assert sorted(dict(_ledger(running.core.config.store_path))) == sorted(ids)


async def test_a_stateless_continuation_reads_a_write_still_queued(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    async with asyncio.timeout(30):
        config = make_config(tmp_path, tool_rounds=10)
        # No state kept in memory: the continuation rebuilds the chain from the store.
        config.cache.recent_max_responses = 0
        running = await server_factory(config)
        gate, _ = _gate_writes(running)
        async with AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client:
            first = await client.create(model="sim-model", input="go", tools=[SHELL_TOOL])
            second = await client.create(
                model="sim-model",
                previous_response_id=first.id,
                tools=[SHELL_TOOL],
                input=[first.call_output("ok")],
            )
            assert running.core.deps.post.written == 0
            gate.set()
            await running.core.deps.post.join()
        assert second.status == "completed" and second.stats["items_validated"] == 3
        assert running.core.deps.post.written == 2


async def test_a_full_queue_makes_the_producer_wait(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    async with asyncio.timeout(30):
        config = make_config(tmp_path)
        # Job 1 stays queued while the writer (gated) writes it; job 2 fills the queue.
        config.post_queue_size = 2
        config.durability.write_linger_ms = 0
        running = await server_factory(config)
        post = running.core.deps.post
        gate, begun = _gate_writes(running)
        async with (
            AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client,
            client.connect() as stream,
        ):
            one = await stream.create(model="sim-model", input="1", stream_id="a")
            two = await stream.create(model="sim-model", input="2", stream_id="b")
            third = asyncio.ensure_future(
                stream.create(model="sim-model", input="3", stream_id="c")
            )
            await until(lambda: post.full_waits > 0)  # job 3 is durable, waits for room
            assert post.full_waits == 1
            assert not third.done()  # its terminal event waits for room in the queue
            assert begun == [one.id]
            gate.set()
            three = await third
        await post.join()
        assert post.written == 3
        assert {r for r, _ in _ledger(running.core.config.store_path)} == {one.id, two.id, three.id}


class _FlakyStore:
    """Fails ``failures`` writes, then hands them to a real store."""

    def __init__(self, store: Store, failures: int) -> None:
        self.store = store
        self.failures = failures

    def stage(self, response_id: str, record: StoredResponse) -> None:
        self.store.stage(response_id, record)

    def unstage(self, response_id: str, record: StoredResponse) -> None:
        self.store.unstage(response_id, record)

    async def write_many(self, jobs: Jobs) -> None:
        if self.failures:
            self.failures -= 1
            raise sqlite3.OperationalError("database or disk is full")
        await self.store.write_many(jobs)


def _row(response_id: str) -> LedgerRow:
    return LedgerRow(
        response_id,
        "t",
        "sim-model",
        "completed",
        10,
        5,
        3,
        1.0,
        0.1,
        0.1,
        "grpc",
        1_700_000_000,
        1_700_000_001,
    )


async def test_failed_writes_are_retried_and_storage_says_when_it_is_down(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with asyncio.timeout(30):
        store = Store(tmp_path / "responses.db")
        flaky: Any = _FlakyStore(store, failures=0)
        journal = Journal(tmp_path / "journal")
        queue = PostQueue(flaky, 8, journal=journal, retry_delay_s=0.001, max_retry_delay_s=0.01)
        await queue.start()
        await queue.put(PostJob(None, _row("resp_a")))
        await queue.join()
        assert queue.written == 1 and queue.health.ok
        assert journal.segments == 1  # the current segment stays open for appends

        flaky.failures = 5  # the disk is full for a while
        queue.admit(store=True)  # still fine: nothing has failed yet
        await queue.put(PostJob(None, _row("resp_b")))
        await queue.put(PostJob(None, _row("resp_c")))
        await queue.join()
        assert queue.written == 3 and queue.retried == 5
        assert queue.health.ok and queue.health.outages == 1
        # Logged once when it broke and once when it recovered, not once per attempt.
        lines = [r.getMessage() for r in caplog.records if "storage" in r.getMessage()]
        assert len(lines) == 2, lines
        assert "database or disk is full" in lines[0] and "recovered" in lines[1]
        await queue.drain()
        store.close()
        assert sorted(r for r, _ in _ledger(tmp_path / "responses.db")) == [
            "resp_a",
            "resp_b",
            "resp_c",
        ]
        assert not list((tmp_path / "journal").glob("*.journal"))  # all written: all gone


async def test_store_true_work_is_refused_while_the_database_is_down(tmp_path: Path) -> None:
    async with asyncio.timeout(30):
        store = Store(tmp_path / "responses.db")
        flaky: Any = _FlakyStore(store, failures=10**9)
        queue = PostQueue(flaky, 8, journal=Journal(tmp_path / "journal"), retry_delay_s=0.001)
        await queue.start()
        await queue.put(PostJob(None, _row("resp_a")))
        await until(lambda: not queue.health.ok)
        with pytest.raises(ApiError) as refused:
            queue.admit(store=True)
        assert refused.value.status == 503 and refused.value.code == "storage_unavailable"
        assert "database or disk is full" in refused.value.message
        queue.admit(store=False)  # responses that store nothing go on
        # Many of them, without waiting for room: the queue never stalls them.
        for n in range(50):
            await queue.put(PostJob(None, _row(f"resp_{n}_x")))
        assert queue.full_waits == 0
        flaky.failures = 0  # space returns
        await queue.join()
        assert queue.health.ok and queue.written == 51
        await queue.drain()
        store.close()


async def test_the_journal_is_replayed_once_at_start(tmp_path: Path) -> None:
    async with asyncio.timeout(30):
        # A process that journaled two jobs and died before writing them to SQLite.
        journal = Journal(tmp_path / "journal")
        await journal.append(PostJob(None, _row("resp_a")).to_json())
        await journal.append(PostJob(None, _row("resp_b")).to_json())
        await journal.append(PostJob(None, _row("resp_a")).to_json())  # a repeat is harmless
        segment = next((tmp_path / "journal").glob("*.journal"))
        # An append cut short by the crash.
        segment.write_bytes(segment.read_bytes() + b"\x10\x00\x00\x00torn")
        store = Store(tmp_path / "responses.db")
        live = PostQueue(store, 8, journal=Journal(tmp_path / "journal"))
        await live.start()
        # The writer is alive (it holds the segment's lock): its journal is not replayed.
        assert live.replayed == 0 and segment.exists()
        await live.drain()
        await journal.close()  # as the process dies: the lock goes, the file stays

        again = PostQueue(store, 8, journal=Journal(tmp_path / "journal"))
        await again.start()
        assert again.replayed == 3 and not segment.exists()
        await again.drain()
        third = PostQueue(store, 8, journal=Journal(tmp_path / "journal"))
        await third.start()
        assert third.replayed == 0
        await third.drain()
        store.close()
        assert sorted(r for r, _ in _ledger(tmp_path / "responses.db")) == ["resp_a", "resp_b"]


async def test_a_response_cut_short_still_gets_its_ledger_row(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    async with asyncio.timeout(30):
        # A slow engine, so that the stream ends while the response is in flight.
        config = make_config(tmp_path, tokens_per_second=50, answer_tokens=500)
        running = await server_factory(config)
        async with (
            AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client,
            client.connect() as stream,
        ):
            events = stream.create_events(model="sim-model", input="write an essay")
            async for event in events:
                if event["type"] == "response.created":
                    response_id = event["response"]["id"]
                if event["type"] == "response.output_text.delta":
                    break
            stream.abort()  # the client goes away mid-response
            await events.aclose()
        # Whether the server has noticed yet or notices while stopping, the response is cut
        # short and queues its ledger row; stopping drains the queue.
        await running.stop(grace=0)
        assert _ledger(running.core.config.store_path) == [(response_id, "cancelled")]


@pytest.mark.parametrize("grace", [0.0, 5.0])
async def test_stop_drains_queued_writes(
    server_factory: ServerFactory, tmp_path: Path, grace: float
) -> None:
    async with asyncio.timeout(30):
        running = await server_factory(tool_rounds=10)
        gate, _ = _gate_writes(running)
        async with (
            AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client,
            client.connect() as stream,
        ):
            ids = [(await stream.create(model="sim-model", input=str(n))).id for n in range(5)]
        assert running.core.deps.post.written == 0
        stopping = asyncio.ensure_future(running.stop(grace=grace))
        await asyncio.sleep(0)
        assert not stopping.done()  # it waits for the writes
        gate.set()
        await stopping
        assert {r for r, _ in _ledger(running.core.config.store_path)} == set(ids)
