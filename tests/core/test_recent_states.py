"""The process-wide cache of recent stored responses' states (``conversation/recent.py``)."""

from __future__ import annotations

from array import array

from bidi_responses.server.core.conversation.recent import RecentStates
from bidi_responses.server.core.conversation.state import (
    ConversationState,
    MemoryBudget,
    ResponseCache,
)


def _state(tokens: int = 100) -> ConversationState:
    return ConversationState(tokens=array("I", range(tokens)), stored_chain=False)


def test_a_state_is_taken_once_and_by_its_own_tenant_only() -> None:
    budget = MemoryBudget(1 << 30)
    recent = RecentStates(8, 1 << 30, budget)
    state = _state()
    recent.keep("tenant-a", "resp_1", state)
    # Kept for a stored response: a continuation's stored form may point at it.
    assert state.stored_chain
    assert recent.held("tenant-b", "resp_1") is None
    assert recent.take_for("tenant-b", "resp_1") is None
    assert recent.take_for(None, "resp_1") is None
    assert "resp_1" in recent  # another tenant's attempt leaves it where it was
    assert recent.held("tenant-a", "resp_1") is state
    assert recent.take_for("tenant-a", "resp_1") is state
    assert recent.take_for("tenant-a", "resp_1") is None  # moved out: a second one rebuilds
    assert budget.used == 0 and len(budget) == 0


def test_entries_are_bounded_by_count_and_bytes_and_the_shared_budget() -> None:
    budget = MemoryBudget(1 << 30)
    recent = RecentStates(2, 1 << 30, budget)
    for i in range(3):
        recent.keep(None, f"resp_{i}", _state())
    assert [rid for rid, _ in recent.entries()] == ["resp_1", "resp_2"]
    assert recent.take_for(None, "resp_0") is None

    # The budget all caches share evicts the least recently kept entry of any of them.
    size = _state().approx_bytes()
    budget = MemoryBudget(2 * size)
    stream = ResponseCache(4, 1 << 30, budget)
    recent = RecentStates(4, 1 << 30, budget)
    stream.put("resp_stream", _state())
    recent.keep(None, "resp_a", _state())
    recent.keep(None, "resp_b", _state())
    assert "resp_stream" not in stream and len(recent) == 2
    recent.keep(None, "resp_c", _state())
    assert recent.take_for(None, "resp_a") is None  # evicted: nothing left behind for it
    assert recent.held(None, "resp_b") is not None and recent.held(None, "resp_c") is not None
    assert budget.used == 2 * size

    # A state larger than the cache's own byte bound is not kept.
    small = RecentStates(4, size - 1, MemoryBudget(1 << 30))
    assert small.keep(None, "resp_big", _state()) == 1
    assert small.held(None, "resp_big") is None and len(small) == 0


def test_nothing_is_kept_when_switched_off() -> None:
    recent = RecentStates(0, 1 << 30, MemoryBudget(1 << 30))
    recent.keep(None, "resp_1", _state())
    assert len(recent) == 0 and recent.take_for(None, "resp_1") is None
