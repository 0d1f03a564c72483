"""Tools and tool_choice, both ways; a list that keeps its protobuf form is not converted."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from bidi_responses.codec import (
    JSONObject,
    JSONValue,
    ProtoTools,
    tool_choice_to_dict,
    tool_choice_to_pb,
    tool_to_dict,
    tool_to_pb,
    tools_to_pb,
)
from bidi_responses.codec.tools import tool_echo_to_dict
from bidi_responses.v1 import responses_pb2 as pb

FUNCTION: JSONObject = {
    "type": "function",
    "name": "sh",
    "description": "Run a command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    "strict": True,
}


@pytest.mark.parametrize(
    "tool",
    [FUNCTION, {"type": "function", "name": "bare"}, {"type": "web_search", "size": "low"}],
    ids=["function", "bare-function", "other"],
)
def test_tool_round_trip(tool: JSONObject) -> None:
    assert tool_to_dict(tool_to_pb(tool)) == tool


def test_the_echo_names_a_functions_unset_fields_as_null() -> None:
    echo = tool_echo_to_dict(tool_to_pb({"type": "function", "name": "bare"}))
    assert echo == {
        "type": "function",
        "name": "bare",
        "description": None,
        "parameters": None,
        "strict": None,
    }
    assert tool_echo_to_dict(tool_to_pb({"type": "mcp"})) == {"type": "mcp"}


@pytest.mark.parametrize("choice", ["auto", "none", "required", {"type": "function", "name": "sh"}])
def test_tool_choice_round_trip(choice: JSONValue) -> None:
    assert tool_choice_to_dict(tool_choice_to_pb(choice)) == choice


def test_an_unset_tool_choice_is_none() -> None:
    assert tool_choice_to_dict(pb.ToolChoice()) is None


class KeptTools(list[JSONObject]):
    """A list with its own protobuf form, as the server's checked tool lists are."""

    def __init__(self, tools: list[JSONObject]) -> None:
        super().__init__(tools)
        self.kept = tuple(tool_to_pb(t) for t in tools)

    def protobuf(self) -> Sequence[pb.Tool]:
        return self.kept


def test_a_list_with_its_own_protobuf_form_is_not_converted_again() -> None:
    kept = KeptTools([FUNCTION])
    assert isinstance(kept, ProtoTools)
    assert tools_to_pb(kept) is kept.kept
    assert list(tools_to_pb([FUNCTION])) == list(kept.kept)
