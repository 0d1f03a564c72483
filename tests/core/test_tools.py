"""``ToolSet``: one checked tool list, reused while the client sends the same list, and what
it derives once (protobuf form, rendered tokens)."""

from __future__ import annotations

from typing import Any

import pytest
from bidi_responses.codec import ProtoEncoder, params_to_dict, params_to_pb, tool_to_dict
from bidi_responses.server.config import Limits
from bidi_responses.server.core.api.errors import ApiError
from bidi_responses.server.core.api.requests import parse_create
from bidi_responses.server.core.api.tools import NO_TOOLS, ToolSet
from bidi_responses.server.core.conversation.state import ResponseCache
from bidi_responses.server.core.rendering.render import Renderer
from bidi_responses.server.core.rendering.tokenizer import load_encoding
from bidi_responses.server.core.runs.lane import Lane
from bidi_responses.server.core.runs.record import ResponseRecord
from bidi_responses.server.engines.format_choice import build_format

LIMITS = Limits()
WEATHER: dict[str, Any] = {
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


# -- what a tool set derives once ----------------------------------------------------------

FORMAT = {"type": "json_schema", "name": "answer", "schema": {"type": "object"}}


def test_protobuf_form_is_built_once_and_matches_the_tools() -> None:
    tools = [WEATHER, {"type": "custom", "name": "x"}]
    toolset = ToolSet.of(tools, LIMITS)
    proto = toolset.protobuf()
    assert [tool_to_dict(t) for t in proto] == [
        {k: v for k, v in tool.items() if v is not None} for tool in toolset.tools
    ]
    assert toolset.protobuf() is proto
    assert (
        ToolSet.of([WEATHER, {"type": "custom", "name": "x"}], LIMITS, toolset).protobuf() is proto
    )


def test_the_encoder_echoes_the_tool_sets_protobuf_form() -> None:
    request = parse_create({"model": "m", "input": "hi", "tools": [WEATHER]}, LIMITS)
    snapshot = ResponseRecord("resp_1", request).snapshot()
    assert snapshot["tools"] is request.toolset.tools
    echoed = ProtoEncoder.response_to_pb(snapshot).tools
    assert list(echoed) == list(request.toolset.protobuf())
    # A response read back from a store holds a plain list: converted, with the same result.
    plain = {**snapshot, "tools": [dict(t) for t in snapshot["tools"]]}
    assert list(ProtoEncoder.response_to_pb(plain).tools) == list(echoed)


def test_grpc_decoded_tools_resolve_to_the_lanes_tool_set() -> None:
    """A stream's tools arrive as Struct (numbers as doubles): each turn decodes them again and
    the lane's tool set is reused by fingerprint, not rebuilt."""
    tools = [{**WEATHER, "parameters": {**WEATHER["parameters"], "maxProperties": 3}}]
    message = params_to_pb({"model": "m", "input": "hi", "tools": tools})
    lane = Lane("lane", ResponseCache(8, 1 << 20))
    first = lane.parse(params_to_dict(message), LIMITS).toolset
    assert lane.parse(params_to_dict(message), LIMITS).toolset is first
    assert lane.toolset is first
    # The engine sees canonical JSON: the integer back, as a JSON client sent it.
    assert type(first.functions[0].parameters["maxProperties"]) is int


@pytest.mark.parametrize("chat_format", ["generic", "harmony"])
def test_prefix_tokens_are_what_the_renderer_writes_for_the_tools(chat_format: str) -> None:
    renderer = build_format(chat_format, load_encoding()).renderer
    toolset = ToolSet.of([WEATHER], LIMITS)
    tokens = toolset.prefix_tokens(renderer)
    assert tokens == renderer.render_prefix(None, toolset.tools)
    assert toolset.prefix_tokens(renderer) is tokens
    assert len(NO_TOOLS.prefix_tokens(renderer)) < len(tokens)


def test_generic_prefix_is_instructions_then_tool_tokens_then_format() -> None:
    """In the generic format the tools section stands alone, so a prompt's prefix is the
    instructions' tokens, the tool set's tokens and the format's, in that order."""
    renderer = Renderer(load_encoding())
    toolset = ToolSet.of([WEATHER], LIMITS)
    assert renderer.render_prefix("Be brief.", toolset.tools, FORMAT) == (
        renderer.render_prefix("Be brief.", [])
        + toolset.prefix_tokens(renderer)
        + renderer.render_prefix(None, [], FORMAT)
    )
