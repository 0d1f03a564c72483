"""The stream's one response cache: forks across lanes, moves within a lane, bounds per lane."""

from __future__ import annotations

from array import array

from bidi_responses.server.core.conversation.state import ConversationState, ResponseCache


def _state(tokens: int) -> ConversationState:
    state = ConversationState(tokens=array("I", range(tokens)))
    state.items.append({"type": "message", "role": "user", "content": []})
    return state


def test_another_lane_forks_a_copy_and_the_owning_lane_moves_the_state() -> None:
    cache = ResponseCache(1, 1 << 30)
    cache.put("resp_a", _state(10), "a")
    fork = cache.take("resp_a", "b")
    assert fork is not None and "resp_a" in cache
    fork.tokens.append(99)
    fork.items.append({"type": "message", "role": "user", "content": []})
    own = cache.take("resp_a", "a")
    assert own is not None and "resp_a" not in cache
    # The fork's changes never reached the source lane's state.
    assert list(own.tokens) == list(range(10)) and len(own.items) == 1


def test_the_count_bound_is_per_lane_and_the_byte_bound_per_stream() -> None:
    one = _state(1000).approx_bytes()
    cache = ResponseCache(1, one * 3 + one // 2)
    cache.put("resp_a1", _state(1000), "a")
    cache.put("resp_b1", _state(1000), "b")
    assert cache.put("resp_a2", _state(1000), "a") == 1  # a's older one goes, b's stays
    assert "resp_b1" in cache and "resp_a1" not in cache
    cache.put("resp_c1", _state(1000), "c")
    assert cache.put("resp_d1", _state(1000), "d") == 1  # over the bytes: the oldest goes
    assert "resp_b1" not in cache and len(cache) == 3
    assert cache.bytes_used <= one * 3 + one // 2
