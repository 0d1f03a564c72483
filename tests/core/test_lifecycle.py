"""The lane machine driven synchronously: no event loop, no server, no runs.

Each test feeds ``LaneMachine`` client events and run outcomes and checks the actions it
answers with, and the lane's named phase.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from bidi_responses.server.core.api.errors import ApiError
from bidi_responses.server.core.lanes.lifecycle import (
    Action,
    Emit,
    LaneLimits,
    LaneMachine,
    LanePhase,
    Start,
    StopAtBoundary,
    Ticket,
)

STEERING = ({"type": "message", "role": "user", "content": "shorter"},)


def _machine(**limits: Any) -> LaneMachine:
    counter = itertools.count(1)
    return LaneMachine(LaneLimits(**limits), lambda: f"steer_{next(counter)}")


def _started(actions: list[Action]) -> list[Ticket]:
    return [action.ticket for action in actions if isinstance(action, Start)]


def _emitted(actions: list[Action]) -> list[dict[str, Any]]:
    return [dict(action.event) for action in actions if isinstance(action, Emit)]


def _run(machine: LaneMachine, lane: str, response_id: str, previous: str | None = None) -> Ticket:
    """A create on ``lane`` that starts at once and sends its response.created."""
    (ticket,) = _started(machine.create(lane, previous, None))
    machine.created(ticket.number, response_id)
    return ticket


def test_creates_on_a_busy_lane_wait_in_order_and_other_lanes_run() -> None:
    machine = _machine()
    first = _run(machine, "a", "resp_1")
    assert machine.phase("a") is LanePhase.ACTIVE
    assert _started(machine.create("a", None, "second")) == []
    assert _started(machine.create("a", None, "third")) == []
    assert [t.lane for t in _started(machine.create("b", None, "other"))] == ["b"]
    assert machine.queued == 2

    (second,) = _started(machine.ended(first.number, "completed"))
    assert second.payload == "second"
    assert machine.phase("a") is LanePhase.ACTIVE
    (third,) = _started(machine.ended(second.number, "refused"))
    assert third.payload == "third"
    assert _started(machine.ended(third.number, "failed")) == []
    assert machine.phase("a") is LanePhase.IDLE


def test_past_the_active_limit_creates_queue_and_the_queue_is_bounded() -> None:
    machine = _machine(max_active=2, max_queued=1)
    one = _run(machine, "a", "resp_a")
    _run(machine, "b", "resp_b")
    assert _started(machine.create("c", None, None)) == []
    assert machine.phase("c") is LanePhase.QUEUED
    with pytest.raises(ApiError) as refused:
        machine.create("d", None, None)
    assert refused.value.code == "too_many_queued_responses"
    # A freed slot goes to the lane that waited.
    assert [t.lane for t in _started(machine.ended(one.number, "completed"))] == ["c"]


def test_named_lanes_are_counted_as_the_hosted_mode_counts_them() -> None:
    machine = _machine(max_named_lanes=2)
    for lane in ("a", "b"):
        machine.ended(_run(machine, lane, f"resp_{lane}").number, "completed")
    # Ended lanes still count; the default lane never does; a used lane can go on.
    machine.ended(_run(machine, "", "resp_default").number, "completed")
    machine.ended(_run(machine, "a", "resp_a2").number, "completed")
    with pytest.raises(ApiError) as refused:
        machine.create("c", None, None)
    assert refused.value.code == "websocket_stream_limit_reached"
    assert refused.value.param == "stream_id"
    assert "c" not in machine.lanes


def test_a_steer_is_accepted_stops_the_target_and_its_successor_runs_first() -> None:
    machine = _machine()
    target = _run(machine, "a", "resp_1")
    machine.create("a", None, "queued create")
    actions = machine.steer("resp_1", "shorter", STEERING)
    (accepted,) = _emitted(actions)
    assert accepted["type"] == "response.steer.accepted"
    assert accepted["steer"] == {"id": "steer_1", "previous_response_id": "resp_1"}
    assert StopAtBoundary("resp_1") in actions
    assert machine.phase("a") is LanePhase.STEERING
    # A second steer joins the first; the stop was asked for already.
    assert not any(isinstance(a, StopAtBoundary) for a in machine.steer("resp_1", "x", STEERING))

    (successor,) = _started(machine.ended(target.number, "incomplete"))
    assert successor.successor_of == "resp_1"
    assert successor.previous_response_id == "resp_1"
    assert [steer.id for steer in successor.steers] == ["steer_1", "steer_2"]
    assert machine.phase("a") is LanePhase.SUCCESSOR
    assert len(machine.outstanding()) == 2
    machine.created(successor.number, "resp_2")
    # Committed at the successor's response.created.
    assert machine.outstanding() == []
    (queued,) = _started(machine.ended(successor.number, "completed"))
    assert queued.payload == "queued create"


def test_a_successor_that_cannot_be_created_fails_each_steer_with_its_id() -> None:
    machine = _machine()
    target = _run(machine, "a", "resp_1")
    machine.steer("resp_1", "shorter", STEERING)
    (successor,) = _started(machine.ended(target.number, "completed"))
    failed = _emitted(machine.ended(successor.number, "refused"))
    assert [event["type"] for event in failed] == ["response.steer.failed"]
    assert failed[0]["steer"] == {
        "previous_response_id": "resp_1",
        "input": "shorter",
        "id": "steer_1",
    }
    assert failed[0]["error"]["code"] == "successor_creation_failed"
    assert machine.outstanding() == []


def test_steers_on_cancelled_or_failed_targets_are_returned() -> None:
    machine = _machine()
    for status, code in (
        ("cancelled", "response_not_active"),
        ("failed", "successor_creation_failed"),
    ):
        target = _run(machine, "a", f"resp_{status}")
        machine.steer(f"resp_{status}", "x", STEERING)
        actions = machine.ended(target.number, status)  # type: ignore[arg-type]
        assert _started(actions) == []
        assert [event["error"]["code"] for event in _emitted(actions)] == [code]
    assert machine.outstanding() == []


def test_a_target_ending_with_tool_calls_parks_the_input_for_the_explicit_create() -> None:
    machine = _machine()
    target = _run(machine, "a", "resp_1")
    machine.steer("resp_1", "shorter", STEERING)
    stub = {"type": "function_call_output", "call_id": "call_1", "name": "shell"}
    pending = _emitted(machine.ended(target.number, "completed", [stub]))  # type: ignore[list-item]
    assert [event["type"] for event in pending] == ["response.steer.pending"]
    assert pending[0]["required_input"] == [stub]
    assert machine.phase("a") is LanePhase.IDLE
    # Another parent, or another lane, does not take it.
    other = _started(machine.create("a", "resp_other", None))[0]
    assert other.steers == []
    machine.ended(other.number, "completed")
    fork = _started(machine.create("b", "resp_1", None))[0]
    assert fork.steers == []
    machine.ended(fork.number, "completed")
    # The explicit continuation on its lane does; a failed one gives it back.
    explicit = _started(machine.create("a", "resp_1", None))[0]
    assert [steer.id for steer in explicit.steers] == ["steer_1"]
    machine.ended(explicit.number, "refused")
    retry = _started(machine.create("a", "resp_1", None))[0]
    assert [steer.id for steer in retry.steers] == ["steer_1"]
    machine.created(retry.number, "resp_2")
    assert machine.outstanding() == []


def test_steers_for_unknown_finished_or_busy_targets_fail() -> None:
    machine = _machine(max_pending_steers=1)
    (unknown,) = _emitted(machine.steer("resp_x", "x", STEERING))
    assert unknown["error"]["code"] == "response_not_found"
    assert "id" not in unknown["steer"]
    done = _run(machine, "a", "resp_done")
    machine.ended(done.number, "completed")
    (finished,) = _emitted(machine.steer("resp_done", "x", STEERING))
    assert finished["error"]["code"] == "response_already_completed"
    _run(machine, "b", "resp_busy")
    machine.steer("resp_busy", "x", STEERING)
    (bounded,) = _emitted(machine.steer("resp_busy", "y", STEERING))
    assert bounded["error"]["code"] == "too_many_pending_steers"
    assert bounded["steer"]["input"] == "y"
    # Before response.created a response cannot be steered.
    (early,) = _started(machine.create("c", None, None))
    assert _emitted(machine.steer("resp_soon", "x", STEERING))[0]["error"]["code"] == (
        "response_not_found"
    )
    assert early.response_id is None


def test_in_append_mode_a_waiting_response_takes_the_input_with_the_tool_outputs() -> None:
    machine = _machine()
    _run(machine, "a", "resp_1")
    machine.steer("resp_1", "early", STEERING)
    stub = {"type": "function_call_output", "call_id": "call_1", "name": "shell"}
    announced = _emitted(machine.waiting("resp_1", [stub]))  # type: ignore[list-item]
    assert [event["type"] for event in announced] == ["response.steer.pending"]
    assert machine.phase("a") is LanePhase.WAITING_FOR_TOOL_OUTPUTS
    # A steer while it waits is announced at once, and never stops anything.
    late = machine.steer("resp_1", "late", STEERING)
    assert [event["type"] for event in _emitted(late)] == [
        "response.steer.accepted",
        "response.steer.pending",
    ]
    assert not any(isinstance(action, StopAtBoundary) for action in late)
    assert [steer.input for steer in machine.resumed("resp_1")] == ["early", "late"]
    assert machine.phase("a") is LanePhase.ACTIVE
    assert machine.outstanding() == []


def test_parked_input_comes_back_when_its_parent_is_gone() -> None:
    machine = _machine()
    target = _run(machine, "a", "resp_1")
    machine.steer("resp_1", "shorter", STEERING)
    stub = {"type": "function_call_output", "call_id": "call_1", "name": "shell"}
    machine.ended(target.number, "completed", [stub])  # type: ignore[list-item]
    explicit = _started(machine.create("a", "resp_1", None))[0]
    failed = _emitted(machine.ended(explicit.number, "refused", parent_lost=True))
    assert [(e["type"], e["steer"].get("id")) for e in failed] == [
        ("response.steer.failed", "steer_1")
    ]
    assert failed[0]["error"]["code"] == "response_not_found"
    assert failed[0]["steer"]["input"] == "shorter"
    assert machine.outstanding() == []
