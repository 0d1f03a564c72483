"""``ToolSet``: one checked tool list, reused while the client sends the same list."""

from __future__ import annotations

import pytest
from bidi_responses.server.config import Limits
from bidi_responses.server.core.errors import ApiError
from bidi_responses.server.core.requests import parse_create
from bidi_responses.server.core.tools import NO_TOOLS, ToolSet

LIMITS = Limits()
WEATHER = {
    "type": "function",
    "name": "weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def test_same_list_in_another_key_order_reuses_the_set() -> None:
    first = ToolSet.of([WEATHER], LIMITS)
    reordered = [{"parameters": WEATHER["parameters"], "name": "weather", "type": "function"}]
    assert ToolSet.of(reordered, LIMITS, first) is first
    assert first.function_names == {"weather"}
    assert [f.name for f in first.functions] == ["weather"]


def test_another_list_builds_a_new_set() -> None:
    first = ToolSet.of([WEATHER], LIMITS)
    other = ToolSet.of([{**WEATHER, "name": "forecast"}], LIMITS, first)
    assert other is not first
    assert other.function_names == {"forecast"}


def test_a_reused_set_is_still_checked_when_the_list_changes() -> None:
    first = ToolSet.of([WEATHER], LIMITS)
    with pytest.raises(ApiError) as caught:
        ToolSet.of([{**WEATHER, "name": "bad name"}], LIMITS, first)
    assert caught.value.param == "tools[0].name"


def test_no_tools() -> None:
    assert ToolSet.of(None, LIMITS) == NO_TOOLS
    assert parse_create({"model": "m", "input": "hi"}, LIMITS).toolset == NO_TOOLS


def test_tool_choice_must_name_a_function_tool_also_with_a_reused_set() -> None:
    body = {"model": "m", "input": "hi", "tools": [WEATHER, {"type": "custom", "name": "x"}]}
    first = parse_create({**body, "tool_choice": {"type": "function", "name": "weather"}}, LIMITS)
    for last in (None, first.toolset):
        with pytest.raises(ApiError) as caught:
            parse_create({**body, "tool_choice": {"type": "function", "name": "x"}}, LIMITS, last)
        assert caught.value.param == "tool_choice.name"
