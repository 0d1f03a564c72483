"""The stream driver over an in-memory wire: admission, the reader (request budget, refusals),
the one write-timeout watch, the end status and cleanup, on the real core with a scripted
engine. The wire is the one thing faked: it is what each transport's adapter provides."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from bidi_responses.schema import JSONValue
from bidi_responses.server.assembly import transport_port
from bidi_responses.server.config import Limits
from bidi_responses.server.core import TransportNaming, TransportPort
from bidi_responses.server.core.api import ApiError, EventRefused, parse_json_event
from bidi_responses.server.core.lanes import StreamNaming
from bidi_responses.server.core.lanes.session import Session
from bidi_responses.server.core.observability import Counters
from bidi_responses.server.core.runs import OutEvent, answers_to
from bidi_responses.server.core.tenancy import ANONYMOUS
from bidi_responses.server.transports.streams import (
    Incoming,
    Refusal,
    StreamDriver,
    WatchedWrites,
    WriteWatch,
    open_stream,
)

from tests.core.fake_engine import ScriptedCore, ScriptedEngine, Turn, started_core
from tests.core.session_events import create

TIMEOUT_S = 20
Frame = dict[str, Any]


class MemoryWire:
    """A stream's connection in memory: the test puts client events in ``inbox`` (None: the
    client stops sending) and reads what was sent from ``outbox``; while ``reading`` is clear,
    a send waits, as for a client that stopped reading."""

    def __init__(self, limits: Limits, *, half_close: bool) -> None:
        self.limits = limits
        self.half_close = half_close
        self.inbox: asyncio.Queue[JSONValue | None] = asyncio.Queue()
        self.outbox: asyncio.Queue[Frame] = asyncio.Queue()
        self.reading = asyncio.Event()
        self.reading.set()
        self.aborted: list[ApiError] = []
        self.closes = 0

    async def receive(self) -> JSONValue | None:
        return await self.inbox.get()

    def size(self, message: JSONValue) -> int:
        return len(orjson.dumps(message))

    def refused(self, message: JSONValue, error: ApiError) -> Refusal:
        return Refusal("", error)

    def decode(self, message: JSONValue) -> Incoming | Refusal | None:
        try:
            return Incoming(parse_json_event(message, self.limits))
        except EventRefused as refused:
            return Refusal(refused.lane, refused.error, answers_to(message))

    def frames(self, ready: list[OutEvent]) -> Sequence[Frame]:
        return [dict(out.data) for out in ready]

    async def send(self, frames: Sequence[Frame]) -> None:
        await self.reading.wait()
        for frame in frames:
            self.outbox.put_nowait(frame)

    async def abort(self, error: ApiError) -> None:
        self.aborted.append(error)

    async def close(self) -> None:
        self.closes += 1

    async def until(self, kind: str) -> list[Frame]:
        """What was sent, up to and including the first event of type ``kind``."""
        seen = []
        while True:
            frame = await self.outbox.get()
            seen.append(frame)
            if frame["type"] == kind:
                return seen


#: The transport of these tests: neutral codes, messages charged at their size.
TEST_NAMING = TransportNaming(
    StreamNaming("test"), one_shot="test", stream_copies=1, one_shot_copies=1
)


def port_of(core: ScriptedCore) -> TransportPort:
    """What a transport is handed of ``core``."""
    return transport_port(core, TEST_NAMING)


@pytest.fixture
async def engine_and_core(tmp_path: Path) -> AsyncIterator[tuple[ScriptedEngine, ScriptedCore]]:
    async with started_core(tmp_path) as started, asyncio.timeout(TIMEOUT_S):
        yield started


def _run(core: ScriptedCore, *, half_close: bool = True) -> tuple[MemoryWire, asyncio.Task[None]]:
    """Admit a stream and run it over a new in-memory wire, as a task."""
    session = open_stream(port_of(core), ANONYMOUS)
    wire = MemoryWire(core.config.limits, half_close=half_close)
    driver = StreamDriver(port_of(core), session, wire)
    return wire, asyncio.get_running_loop().create_task(driver.run())


async def test_a_write_pending_for_the_timeout_cuts_the_stream_off_once(
    engine_and_core: tuple[ScriptedEngine, ScriptedCore],
) -> None:
    engine, core = engine_and_core
    core.config.limits.write_timeout_s = 0.2
    hold = asyncio.Event()
    engine.turns.append(Turn(hold=hold))
    wire, running = _run(core)
    wire.reading.clear()  # the client stops reading
    await wire.inbox.put(create())
    await running  # the watch ends the stream by itself
    assert [error.code for error in wire.aborted] == ["write_timeout"]
    assert wire.aborted[0].status == 429
    assert wire.closes == 0
    assert core.counters.write_timeouts == 1
    # Its engine work was cancelled and the session closed.
    assert engine.cancelled.is_set()
    assert core.sessions_open == 0
    # Nothing was written past the stall, and nothing more is counted.
    assert wire.outbox.empty()
    assert core.counters.write_timeouts == 1


async def test_writes_that_keep_moving_are_not_cut_off(
    engine_and_core: tuple[ScriptedEngine, ScriptedCore],
) -> None:
    engine, core = engine_and_core
    core.config.limits.write_timeout_s = 0.2
    engine.turns.extend([Turn(), Turn()])
    wire, running = _run(core)
    await wire.inbox.put(create())
    await wire.until("response.completed")
    await wire.inbox.put(create())
    await wire.until("response.completed")
    await wire.inbox.put(None)  # half-close: the stream ends once its responses have
    await running
    assert core.counters.write_timeouts == 0
    assert wire.closes == 1 and not wire.aborted
    assert core.sessions_open == 0


async def test_a_draining_server_admits_no_stream(
    engine_and_core: tuple[ScriptedEngine, ScriptedCore],
) -> None:
    _, core = engine_and_core
    core.begin_drain()
    with pytest.raises(ApiError) as refused:
        open_stream(port_of(core), ANONYMOUS, refused="requests")
    assert refused.value.code == "server_shutting_down"
    assert refused.value.status == 503
    assert "takes no new requests" in refused.value.message
    assert core.sessions_open == 0


async def test_a_transport_check_refuses_before_a_session_opens(
    engine_and_core: tuple[ScriptedEngine, ScriptedCore],
) -> None:
    _, core = engine_and_core

    def too_many() -> None:
        raise ApiError("too many", code="rate_limit_exceeded", status=429)

    with pytest.raises(ApiError) as refused:
        open_stream(port_of(core), ANONYMOUS, check=too_many)
    assert refused.value.code == "rate_limit_exceeded"
    assert core.sessions_open == 0


async def test_a_message_over_the_request_budget_is_an_error_and_the_stream_goes_on(
    engine_and_core: tuple[ScriptedEngine, ScriptedCore],
) -> None:
    engine, core = engine_and_core
    engine.turns.append(Turn())
    small = create(event_id="evt_small")
    core.request_bytes.limit = len(orjson.dumps(small)) + 10
    wire, running = _run(core)
    await wire.inbox.put(create(input="x" * 1000, event_id="evt_big"))
    [refused] = await wire.until("error")
    assert refused["status"] == 429
    assert refused["error"]["code"] == "server_busy"
    # The same stream still serves a create that fits.
    await wire.inbox.put(small)
    seen = await wire.until("response.completed")
    assert seen[0]["type"] == "response.created"
    assert core.request_bytes.held == 0  # released once the session took it
    await wire.inbox.put(None)
    await running
    assert wire.closes == 1


async def test_an_event_that_cannot_be_typed_is_an_error_and_the_stream_goes_on(
    engine_and_core: tuple[ScriptedEngine, ScriptedCore],
) -> None:
    engine, core = engine_and_core
    engine.turns.append(Turn())
    wire, running = _run(core)
    await wire.inbox.put(create(stream_id="bad lane!", event_id="evt_1"))
    [refused] = await wire.until("error")
    assert refused["error"]["code"] == "invalid_stream_id"
    assert refused["error"]["event_id"] == "evt_1"  # the answer names the event
    await wire.inbox.put(create())
    await wire.until("response.completed")
    assert core.request_bytes.held == 0
    await wire.inbox.put(None)
    await running


async def test_the_client_going_away_closes_the_session_and_stops_its_work(
    engine_and_core: tuple[ScriptedEngine, ScriptedCore],
) -> None:
    engine, core = engine_and_core
    hold = asyncio.Event()
    engine.turns.append(Turn(hold=hold))
    wire, running = _run(core, half_close=False)
    await wire.inbox.put(create())
    await wire.until("response.output_text.delta")
    await engine.holding.wait()
    await wire.inbox.put(None)  # the connection is gone
    await running
    assert engine.cancelled.is_set()
    assert core.sessions_open == 0
    assert not core.deps.state.inflight
    assert wire.closes == 0 and not wire.aborted  # nobody to tell


def _live_terminal_events() -> list[OutEvent]:
    gc.collect()
    return [
        obj
        for obj in gc.get_objects()
        if isinstance(obj, OutEvent) and obj.data["type"] == "response.completed"
    ]


async def test_an_idle_stream_keeps_no_event_it_sent(
    engine_and_core: tuple[ScriptedEngine, ScriptedCore],
) -> None:
    """While it waits for more, the writer holds nothing of what it sent: an idle stream
    would otherwise keep its last terminal event, which carries the whole response."""
    engine, core = engine_and_core
    engine.turns.append(Turn())
    session = open_stream(port_of(core), ANONYMOUS)
    wire = MemoryWire(core.config.limits, half_close=True)
    running = asyncio.get_running_loop().create_task(
        StreamDriver(port_of(core), session, wire).run()
    )
    await wire.inbox.put(create())
    await wire.until("response.completed")
    assert isinstance(session, Session)
    assert session.quiet  # idle: the writer waits for the next event
    assert _live_terminal_events() == []
    await wire.inbox.put(None)
    await running


class SlowToStopWire(MemoryWire):
    """A wire whose pending write takes a while to give up when cancelled (as a transport's
    write completes its frame first): the stream's cleanup then waits on it."""

    def __init__(self, limits: Limits) -> None:
        super().__init__(limits, half_close=False)
        self.stopping = asyncio.Event()
        self.stopped = asyncio.Event()

    async def send(self, frames: Sequence[Frame]) -> None:
        try:
            await self.reading.wait()
        except asyncio.CancelledError:
            self.stopping.set()
            await self.stopped.wait()
            raise
        for frame in frames:
            self.outbox.put_nowait(frame)


async def test_a_cancel_during_the_streams_cleanup_still_closes_its_session(
    engine_and_core: tuple[ScriptedEngine, ScriptedCore],
) -> None:
    """The handler is cancelled (its client cancelled the call) while it stops its writes,
    after the client went away: the session is closed all the same, nothing counted open."""
    engine, core = engine_and_core
    engine.turns.append(Turn(hold=asyncio.Event()))
    session = open_stream(port_of(core), ANONYMOUS)
    wire = SlowToStopWire(core.config.limits)
    running = asyncio.get_running_loop().create_task(
        StreamDriver(port_of(core), session, wire).run()
    )
    wire.reading.clear()  # a write is pending
    await wire.inbox.put(create())
    await engine.holding.wait()
    await wire.inbox.put(None)  # the client goes away: the cleanup stops the writer
    await wire.stopping.wait()
    running.cancel()  # the cancel arrives in the middle of the cleanup
    wire.stopped.set()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert core.sessions_open == 0
    assert engine.cancelled.is_set()
    assert not core.deps.state.inflight


async def test_a_stream_the_server_ends_is_aborted_with_its_reason(
    engine_and_core: tuple[ScriptedEngine, ScriptedCore],
) -> None:
    engine, core = engine_and_core
    engine.turns.append(Turn())
    wire, running = _run(core)
    await wire.inbox.put(create())
    await wire.until("response.created")
    await core.drain_streams()  # the response in flight finishes first
    await running
    # Everything was written before the stream ended: the warning and the terminal event.
    sent = [wire.outbox.get_nowait() for _ in range(wire.outbox.qsize())]
    assert {"warning", "response.completed"} <= {frame["type"] for frame in sent}
    assert [f["code"] for f in sent if f["type"] == "warning"] == ["server_draining"]
    assert [error.code for error in wire.aborted] == ["server_shutting_down"]
    assert wire.closes == 0
    assert core.sessions_open == 0


async def test_watched_writes_cut_off_a_stalled_writer_and_count_it() -> None:
    async with asyncio.timeout(TIMEOUT_S):
        counters = Counters()
        never = asyncio.Event()

        async def stalled(watch: WriteWatch) -> None:
            watch.begin()
            await never.wait()

        assert await WatchedWrites(stalled, 0.05, counters, "stalled").wait()
        assert counters.write_timeouts == 1

        async def quick(watch: WriteWatch) -> None:
            for _ in range(3):
                watch.begin()
                await asyncio.sleep(0)
                watch.end()

        assert not await WatchedWrites(quick, 0.05, counters, "quick").wait()
        assert counters.write_timeouts == 1

        async def failing(watch: WriteWatch) -> None:
            raise ConnectionResetError

        with pytest.raises(ConnectionResetError):
            await WatchedWrites(failing, 0.05, counters, "failing").wait()
        assert counters.write_timeouts == 1
