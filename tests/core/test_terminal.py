"""A response's end on its own (``runs.terminal``): from its record, account, state and lane,
with no run behind them.

``test_runner.py`` and ``test_session.py`` see the same ends through a running response.
"""

from __future__ import annotations

import time

from bidi_responses.schema import Outcome, ResponseObject
from bidi_responses.server.core.conversation.state import ConversationState, ResponseCache
from bidi_responses.server.core.observability.metrics import ResponseMetrics
from bidi_responses.server.core.runs import terminal
from bidi_responses.server.core.runs.account import RunAccount
from bidi_responses.server.core.runs.lane import Lane
from bidi_responses.server.core.runs.record import ResponseRecord
from bidi_responses.server.core.tenancy.caller import ANONYMOUS

from tests.core.fake_engine import ScriptedCore, ScriptedEngine


def _lane(core: ScriptedCore) -> Lane:
    cache = core.config.cache
    return Lane("", ResponseCache(cache.max_responses, cache.max_bytes, core.deps.cache_budget))


def _started(core: ScriptedCore, lane: Lane, response_id: str) -> tuple[ResponseRecord, RunAccount]:
    request = lane.parse({"model": "sim-model", "input": "hi"}, core.deps.config.limits)
    account = RunAccount(time.perf_counter(), ANONYMOUS, "test")
    account.started = True
    return ResponseRecord(id=response_id, request=request), account


def _metrics(core: ScriptedCore) -> ResponseMetrics:
    return ResponseMetrics(core.deps.metrics, "test", "sim-model", time.perf_counter())


async def test_finish_caches_the_state_writes_the_rows_and_announces_last(
    engine_and_core: tuple[ScriptedEngine, ScriptedCore],
) -> None:
    _, core = engine_and_core
    lane = _lane(core)
    record, account = _started(core, lane, "resp_finished")
    state = ConversationState()
    announced: list[tuple[Outcome, ResponseObject]] = []

    async def announce(outcome: Outcome, snapshot: ResponseObject) -> None:
        # By now the rows are queued and the state is where the next turn finds it.
        assert account.posted and lane.cache is not None and "resp_finished" in lane.cache
        announced.append((outcome, snapshot))

    await terminal.finish(
        core.deps, lane, record, account, state, _metrics(core), announce, "completed"
    )
    await core.deps.post.join()

    [(outcome, snapshot)] = announced
    assert outcome == "completed" and snapshot["status"] == "completed"
    assert lane.cache is not None and lane.cache.take("resp_finished", lane.id) is state
    rows = await core.deps.store.ledger_rows()
    assert [(row.response_id, row.transport) for row in rows] == [("resp_finished", "test")]


async def test_abandon_keeps_the_usage_of_a_started_response_once(
    engine_and_core: tuple[ScriptedEngine, ScriptedCore],
) -> None:
    _, core = engine_and_core
    lane = _lane(core)
    record, account = _started(core, lane, "resp_abandoned")
    metrics = _metrics(core)

    terminal.abandon(core.deps, record, account, None, metrics)
    terminal.abandon(core.deps, record, account, None, metrics)  # a second end queues nothing
    await core.deps.post.join()

    assert record.status == "cancelled" and record.incomplete_reason == "client_gone"
    rows = await core.deps.store.ledger_rows()
    assert [row.response_id for row in rows] == ["resp_abandoned"]
