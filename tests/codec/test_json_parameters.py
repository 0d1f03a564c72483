"""Function schemas as JSON text (``FunctionTool.parameters_json``): read in place of the
Struct, written only when asked for, and a deep schema stays readable by stock parsers."""

from __future__ import annotations

import orjson
import pytest
from bidi_responses.codec import (
    EventDecoder,
    JSONObject,
    JSONValue,
    ProtoDecoder,
    ProtoEncoder,
    params_to_dict,
    params_to_pb,
    tool_to_dict,
    tool_to_pb,
)
from bidi_responses.server.core.api.tools import ToolList
from bidi_responses.v1 import responses_pb2 as pb
from google.protobuf.message import DecodeError

from tests.codec.headline_turn import response

SCHEMA: JSONObject = {
    "type": "object",
    "properties": {"n": {"type": "integer", "maximum": 600000}},
    "required": ["n"],
}
TOOL: JSONObject = {"type": "function", "name": "f", "parameters": SCHEMA, "strict": False}


def _deep_schema(levels: int) -> JSONObject:
    schema: JSONObject = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def test_the_json_form_reads_back_as_sent_integers_and_key_order_kept() -> None:
    message = tool_to_pb(TOOL, json_parameters=True)
    assert message.function.parameters_json == orjson.dumps(SCHEMA)
    assert not message.function.HasField("parameters")
    read = tool_to_dict(pb.Tool.FromString(message.SerializeToString()))
    assert read == TOOL
    assert list(read["parameters"]) == list(SCHEMA)
    assert isinstance(read["parameters"]["properties"]["n"]["maximum"], int)


def test_the_json_form_wins_when_both_are_set() -> None:
    message = tool_to_pb(TOOL)
    message.function.parameters_json = b'{"type":"object","properties":{}}'
    assert tool_to_dict(message)["parameters"] == {"type": "object", "properties": {}}


def test_text_that_is_not_json_is_passed_on_for_the_core_to_refuse() -> None:
    message = tool_to_pb(TOOL)
    message.function.parameters_json = b"{not json"
    assert tool_to_dict(message)["parameters"] == "{not json"


@pytest.mark.parametrize("json_parameters", [False, True])
def test_a_create_in_either_form_decodes_to_the_same_body(json_parameters: bool) -> None:
    body: JSONObject = {"model": "m", "input": "hi", "tools": [TOOL]}
    params = params_to_pb(body, json_parameters=json_parameters)
    raw = pb.ConnectRequest(response_create=params).SerializeToString()
    event = ProtoDecoder.client_event(
        pb.ConnectRequest.FromString(raw), ProtoDecoder.tool_keys(raw)
    )
    expected: JSONValue = orjson.loads(orjson.dumps(SCHEMA))
    if not json_parameters:  # a Struct keeps numbers as doubles and sorts no keys back
        assert event["tools"][0]["parameters"]["properties"]["n"]["maximum"] == 600000.0
    assert event["tools"][0]["parameters"] == expected
    assert params_to_dict(params)["tools"] == event["tools"]


def test_a_deep_schema_echo_is_readable_by_a_stock_parser_only_as_json() -> None:
    deep = ToolList([{"type": "function", "name": "deep", "parameters": _deep_schema(40)}])
    created: JSONObject = {
        "type": "response.created",
        "response": {**response("in_progress", []), "tools": deep},
    }
    with pytest.raises(DecodeError):  # 40 JSON levels: ~120 message levels as Structs
        pb.ConnectResponse.FromString(ProtoEncoder().event_bytes("", created))
    data = ProtoEncoder(json_parameters=True).event_bytes("", created)
    read = EventDecoder.event(pb.ConnectResponse.FromString(data))
    assert read["response"]["tools"][0]["parameters"] == _deep_schema(40)
