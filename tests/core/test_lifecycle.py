"""The lane machine driven synchronously: no event loop, no server, no runs.

Each test feeds ``LaneMachine`` client events and run outcomes and checks the actions it
answers with, and the lane's named phase.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from bidi_responses.schema import JSONObject, RequiredInputStub
from bidi_responses.server.core.lanes.actions import (
    Action,
    CancelRun,
    Emit,
    LaneLimits,
    Offer,
    Refuse,
    RunEnd,
    RunStatus,
    Start,
    StopAtBoundary,
    Ticket,
)
from bidi_responses.server.core.lanes.lifecycle import LaneMachine, LanePhase

STEERING = ({"type": "message", "role": "user", "content": "shorter"},)
STUB: RequiredInputStub = {"type": "function_call_output", "call_id": "call_1", "name": "shell"}


@dataclass(frozen=True)
class Req:
    """A create's request as the machine sees it: a name, a parent, and the input."""

    name: str | None = None
    previous_response_id: str | None = None
    input: list[JSONObject] = field(default_factory=list)

    def successor(self, response_id: str, steering: list[JSONObject]) -> Req:
        return Req(self.name, response_id, steering)


Machine = LaneMachine[Req]


def _machine(**limits: Any) -> Machine:
    counter = itertools.count(1)
    return LaneMachine(LaneLimits(**limits), lambda: f"steer_{next(counter)}")


def _create(
    machine: Machine, lane: str, previous: str | None = None, name: str | None = None
) -> list[Action[Req]]:
    return machine.create(lane, Req(name, previous))


def _ended(
    machine: Machine,
    number: int,
    status: RunStatus,
    required: list[RequiredInputStub] | None = None,
    *,
    parent_lost: bool = False,
) -> list[Action[Req]]:
    """Run ``number`` ended and its task is done."""
    return machine.done(number, RunEnd(status, required or [], parent_lost))


def _started(actions: list[Action[Req]]) -> list[Ticket[Req]]:
    return [action.ticket for action in actions if isinstance(action, Start)]


def _emitted(actions: list[Action[Req]]) -> list[dict[str, Any]]:
    return [dict(action.event) for action in actions if isinstance(action, Emit)]


def _refused(actions: list[Action[Req]]) -> list[Refuse]:
    return [action for action in actions if isinstance(action, Refuse)]


def _run(machine: Machine, lane: str, response_id: str, previous: str | None = None) -> Ticket[Req]:
    """A create on ``lane`` that starts at once and sends its response.created."""
    (ticket,) = _started(_create(machine, lane, previous))
    machine.created(ticket.number, response_id)
    return ticket


def test_creates_on_a_busy_lane_wait_in_order_and_other_lanes_run() -> None:
    machine = _machine()
    first = _run(machine, "a", "resp_1")
    assert machine.phase("a") is LanePhase.ACTIVE
    assert _started(_create(machine, "a", name="second")) == []
    assert _started(_create(machine, "a", name="third")) == []
    assert [t.lane for t in _started(_create(machine, "b", name="other"))] == ["b"]
    assert machine.queued == 2

    (second,) = _started(_ended(machine, first.number, "completed"))
    assert second.request.name == "second"
    assert machine.phase("a") is LanePhase.ACTIVE
    (third,) = _started(_ended(machine, second.number, "refused"))
    assert third.request.name == "third"
    assert _started(_ended(machine, third.number, "failed")) == []
    assert machine.phase("a") is LanePhase.IDLE


def test_past_the_active_limit_creates_queue_and_the_queue_is_bounded() -> None:
    machine = _machine(max_active=2, max_queued=1)
    one = _run(machine, "a", "resp_a")
    _run(machine, "b", "resp_b")
    assert _started(_create(machine, "c")) == []
    assert machine.phase("c") is LanePhase.QUEUED
    (refused,) = _refused(_create(machine, "d"))
    assert (refused.lane, refused.error.code) == ("d", "too_many_queued_responses")
    # A freed slot goes to the lane that waited.
    assert [t.lane for t in _started(_ended(machine, one.number, "completed"))] == ["c"]


def test_named_lanes_are_counted_as_the_hosted_mode_counts_them() -> None:
    machine = _machine(max_named_lanes=2)
    for lane in ("a", "b"):
        _ended(machine, _run(machine, lane, f"resp_{lane}").number, "completed")
    # Ended lanes still count; the default lane never does; a used lane can go on.
    _ended(machine, _run(machine, "", "resp_default").number, "completed")
    _ended(machine, _run(machine, "a", "resp_a2").number, "completed")
    (refused,) = _refused(_create(machine, "c"))
    assert refused.error.code == "stream_limit_reached"
    assert refused.error.param == "stream_id"
    assert "c" not in machine.lanes


def test_a_steer_is_accepted_stops_the_target_and_its_successor_runs_first() -> None:
    machine = _machine()
    target = _run(machine, "a", "resp_1")
    _create(machine, "a", name="queued create")
    actions = machine.steer("resp_1", "shorter", STEERING)
    (accepted,) = _emitted(actions)
    assert accepted["type"] == "response.steer.accepted"
    assert accepted["steer"] == {"id": "steer_1", "previous_response_id": "resp_1"}
    assert StopAtBoundary(target.number) in actions
    assert machine.phase("a") is LanePhase.STEERING
    # A second steer joins the first; the stop was asked for already.
    assert not any(isinstance(a, StopAtBoundary) for a in machine.steer("resp_1", "x", STEERING))

    (successor,) = _started(_ended(machine, target.number, "incomplete"))
    assert successor.successor_of == "resp_1"
    assert successor.previous_response_id == "resp_1"
    assert [steer.id for steer in successor.steers] == ["steer_1", "steer_2"]
    assert machine.phase("a") is LanePhase.SUCCESSOR
    assert len(machine.outstanding()) == 2
    machine.created(successor.number, "resp_2")
    # Committed at the successor's response.created.
    assert machine.outstanding() == []
    (queued,) = _started(_ended(machine, successor.number, "completed"))
    assert queued.request.name == "queued create"


def test_a_successor_that_cannot_be_created_fails_each_steer_with_its_id() -> None:
    machine = _machine()
    target = _run(machine, "a", "resp_1")
    machine.steer("resp_1", "shorter", STEERING)
    (successor,) = _started(_ended(machine, target.number, "completed"))
    failed = _emitted(_ended(machine, successor.number, "refused"))
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
        actions = _ended(machine, target.number, status)  # type: ignore[arg-type]
        assert _started(actions) == []
        assert [event["error"]["code"] for event in _emitted(actions)] == [code]
    assert machine.outstanding() == []


def test_a_target_ending_with_tool_calls_parks_the_input_for_the_explicit_create() -> None:
    machine = _machine()
    target = _run(machine, "a", "resp_1")
    machine.steer("resp_1", "shorter", STEERING)
    stub = {"type": "function_call_output", "call_id": "call_1", "name": "shell"}
    pending = _emitted(_ended(machine, target.number, "completed", [stub]))  # type: ignore[list-item]
    assert [event["type"] for event in pending] == ["response.steer.pending"]
    assert pending[0]["required_input"] == [stub]
    assert machine.phase("a") is LanePhase.IDLE
    # Another parent, or another lane, does not take it.
    other = _started(_create(machine, "a", "resp_other"))[0]
    assert other.steers == []
    _ended(machine, other.number, "completed")
    fork = _started(_create(machine, "b", "resp_1"))[0]
    assert fork.steers == []
    _ended(machine, fork.number, "completed")
    # The explicit continuation on its lane does; a failed one gives it back.
    explicit = _started(_create(machine, "a", "resp_1"))[0]
    assert [steer.id for steer in explicit.steers] == ["steer_1"]
    _ended(machine, explicit.number, "refused")
    retry = _started(_create(machine, "a", "resp_1"))[0]
    assert [steer.id for steer in retry.steers] == ["steer_1"]
    machine.created(retry.number, "resp_2")
    assert machine.outstanding() == []


def test_steers_for_unknown_finished_or_busy_targets_fail() -> None:
    machine = _machine(max_pending_steers=1)
    (unknown,) = _emitted(machine.steer("resp_x", "x", STEERING))
    assert unknown["error"]["code"] == "response_not_found"
    assert "id" not in unknown["steer"]
    done = _run(machine, "a", "resp_done")
    _ended(machine, done.number, "completed")
    (finished,) = _emitted(machine.steer("resp_done", "x", STEERING))
    assert finished["error"]["code"] == "response_already_completed"
    _run(machine, "b", "resp_busy")
    machine.steer("resp_busy", "x", STEERING)
    (bounded,) = _emitted(machine.steer("resp_busy", "y", STEERING))
    assert bounded["error"]["code"] == "too_many_pending_steers"
    assert bounded["steer"]["input"] == "y"
    # Before response.created a response cannot be steered.
    (early,) = _started(_create(machine, "c"))
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
    _ended(machine, target.number, "completed", [stub])  # type: ignore[list-item]
    explicit = _started(_create(machine, "a", "resp_1"))[0]
    failed = _emitted(_ended(machine, explicit.number, "refused", parent_lost=True))
    assert [(e["type"], e["steer"].get("id")) for e in failed] == [
        ("response.steer.failed", "steer_1")
    ]
    assert failed[0]["error"]["code"] == "response_not_found"
    assert failed[0]["steer"]["input"] == "shorter"
    assert machine.outstanding() == []


def test_a_successor_is_the_steered_request_continued_with_the_steering_input() -> None:
    machine = _machine()
    (target,) = _started(_create(machine, "a", "resp_0", name="settings of the target"))
    machine.created(target.number, "resp_1")
    machine.steer("resp_1", "shorter", STEERING)
    (successor,) = _started(_ended(machine, target.number, "incomplete"))
    assert successor.request == Req("settings of the target", "resp_1", list(STEERING))


def test_what_follows_a_run_waits_until_its_task_is_done() -> None:
    machine = _machine()
    first = _run(machine, "a", "resp_1")
    _create(machine, "a", name="next")
    machine.ending(first.number, RunEnd("completed"))
    # Its terminal event goes out now: a steer finds it ended, the next create is held.
    (late,) = _emitted(machine.steer("resp_1", "x", STEERING))
    assert late["error"]["code"] == "response_already_completed"
    # Its run is still finishing; the next one has not started.
    assert _refused(machine.cancel("a", None, run_id=None))[0].error.code == "response_not_found"
    (follows,) = _started(machine.done(first.number, RunEnd("completed")))
    assert follows.request.name == "next"
    assert machine.cancel("a", None, run_id="resp_2") == [CancelRun(follows.number)]


def test_appends_go_to_the_lanes_running_response_or_are_refused() -> None:
    machine = _machine()
    (refused,) = _refused(machine.append("a", "resp_1", []))
    assert (refused.lane, refused.error.code, refused.error.status) == (
        "a",
        "response_not_waiting",
        409,
    )
    ticket = _run(machine, "a", "resp_1")
    # The run itself checks the id and the outputs (ApiError answers the append).
    assert machine.append("a", "resp_other", ["x"]) == [
        Offer(ticket.number, "a", "resp_other", ["x"])
    ]


def test_an_inject_is_offered_to_a_waiting_response_and_acknowledged() -> None:
    machine = _machine()
    (unknown,) = _emitted(machine.inject("resp_x", [{"type": "x"}], waiting=False))
    assert unknown["type"] == "response.inject.failed"
    assert unknown["error"]["code"] == "response_not_found"
    assert unknown["input"] == [{"type": "x"}]
    ticket = _run(machine, "b", "resp_1")
    busy = machine.inject("resp_1", [], waiting=False)
    assert [action.lane for action in busy if isinstance(action, Emit)] == ["b"]
    (not_waiting,) = _emitted(busy)
    assert not_waiting["error"]["code"] == "response_already_completed"
    offered = machine.inject("resp_1", ["out"], waiting=True)
    assert offered == [Offer(ticket.number, "b", "resp_1", ["out"], inject=True)]
    (created,) = _emitted(machine.injected("resp_1"))
    assert created["type"] == "response.inject.created"
    # Control events share one sequence.
    assert created["sequence_number"] == not_waiting["sequence_number"] + 1


def test_a_cancel_names_the_lanes_running_response_or_is_refused() -> None:
    machine = _machine()
    (idle,) = _refused(machine.cancel("a", None, run_id=None))
    assert (idle.error.code, idle.error.status, idle.error.param) == (
        "response_not_found",
        404,
        "response_id",
    )
    ticket = _run(machine, "a", "resp_1")
    other = machine.cancel("a", "resp_other", run_id="resp_1")
    assert _refused(other)[0].error.code == "response_not_found"
    assert machine.cancel("a", "resp_1", run_id="resp_1") == [CancelRun(ticket.number)]
    assert machine.cancel("a", None, run_id="resp_1") == [CancelRun(ticket.number)]
    # Before its response.created, by the id its run already has (a retried key's).
    (early,) = _started(_create(machine, "b"))
    assert machine.cancel("b", "resp_keyed", run_id="resp_keyed") == [CancelRun(early.number)]


def test_at_the_end_of_input_the_runs_waiting_for_tool_outputs_end() -> None:
    machine = _machine()
    one = _run(machine, "a", "resp_1")
    two = _run(machine, "b", "resp_2")
    _create(machine, "b")  # queued: never started, nothing to cancel
    assert machine.end_of_input() == [
        CancelRun(one.number, "client_gone", if_waiting=True),
        CancelRun(two.number, "client_gone", if_waiting=True),
    ]


def test_a_waiting_response_is_in_its_phase_until_resumed() -> None:
    machine = _machine()
    _run(machine, "a", "resp_1")
    assert _emitted(machine.waiting("resp_1", [STUB])) == []
    assert machine.phase("a") is LanePhase.WAITING_FOR_TOOL_OUTPUTS
    assert machine.resumed("resp_1") == []
    assert machine.phase("a") is LanePhase.ACTIVE


def test_admission_opens_and_counts_a_lane_before_its_create_is_checked() -> None:
    machine = _machine(max_named_lanes=1, max_active=1, max_queued=0)
    # Admitted, not yet created (its request is checked next): the lane counts already.
    assert machine.admit("a") == []
    assert machine.lanes == ["a"]
    (over,) = _refused(machine.admit("b"))
    assert over.error.code == "stream_limit_reached"
    _run(machine, "a", "resp_1")
    (full,) = _refused(machine.admit("a"))
    assert (full.error.code, full.error.status) == ("too_many_queued_responses", 429)
