"""The server-wide budget on request bytes: charges, refusals and releases."""

from __future__ import annotations

import pytest
from bidi_responses.server.core.api.errors import ApiError
from bidi_responses.server.core.tenancy.request_budget import RequestBytes
from hypothesis import given
from hypothesis import strategies as st


def test_a_charge_past_the_budget_is_refused_and_leaves_nothing_charged() -> None:
    budget = RequestBytes(100)
    budget.take(60)
    with pytest.raises(ApiError) as refused:
        budget.take(41)
    error = refused.value
    assert error.status == 429 and error.code == "server_busy"
    assert "server-wide" in str(error) and error.metadata["limit"] == "max_inflight_request_bytes"
    assert budget.held == 60 and budget.refused == 1
    with budget.holding(40):
        assert budget.held == 100
    assert budget.held == 60


def test_no_budget_takes_anything() -> None:
    budget = RequestBytes(0)
    budget.take(10**12)
    assert budget.held == 10**12


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 50)), max_size=60))
def test_held_is_what_was_taken_and_not_released(ops: list[tuple[bool, int]]) -> None:
    """Against a recomputation: held never passes the limit and equals the taken charges
    that are still outstanding."""
    budget = RequestBytes(200)
    outstanding: list[int] = []
    for take, size in ops:
        if take:
            try:
                budget.take(size)
                outstanding.append(size)
            except ApiError:
                assert sum(outstanding) + size > 200
        elif outstanding:
            budget.release(outstanding.pop())
        assert budget.held == sum(outstanding) <= 200
