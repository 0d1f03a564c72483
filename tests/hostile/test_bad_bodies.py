"""Hostile and malformed bodies: a 4xx with a code and a param on every transport, never a
500, and the connection or stream serves the next request."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest
from bidi_responses.client import AsyncResponsesClient, ResponsesError
from bidi_responses.server.app import RunningServer
from bidi_responses.server.core.api.jsonshape import MAX_JSON_DEPTH

from tests.conftest import SHELL_TOOL
from tests.hostile.test_grpc_decode import nested_schema, nested_value
from tests.ws.conftest import connector, error_of

CALL = {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{}"}


def msg(**fields: Any) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": "hi", **fields}


def body(input: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "sim-model", "input": input, "store": False, **extra}


# (name, body, code, param); every row is refused with exactly that code and param.
BAD: list[tuple[str, dict[str, Any], str, str]] = [
    ("status bogus", body([msg(status="bogus")]), "invalid_value", "input[0].status"),
    (
        "image detail",
        body(
            [
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "u", "detail": "ultra"}],
                }
            ]
        ),
        "invalid_value",
        "input[0].content[0].detail",
    ),
    (
        "arguments as object",
        body([{**CALL, "arguments": {"cmd": "ls"}}], tools=[SHELL_TOOL]),
        "invalid_type",
        "input[0].arguments",
    ),
    (
        "empty call name",
        body([{**CALL, "name": ""}]),
        "missing_required_parameter",
        "input[0].name",
    ),
    (
        "type as list",
        body([{"type": ["message"], "role": "user"}]),
        "invalid_type",
        "input[0].type",
    ),
    ("role as object", body([msg(role={"a": 1})]), "invalid_value", "input[0].role"),
    (
        "part type as list",
        body([msg(content=[{"type": ["input_text"], "text": "x"}])]),
        "invalid_value",
        "input[0].content[0].type",
    ),
    (
        "custom call without call_id",
        body([{"type": "custom_tool_call", "name": "apply_patch", "input": "x"}]),
        "missing_required_parameter",
        "input[0].call_id",
    ),
    (
        "custom call call_id as list",
        body([{"type": "custom_tool_call", "name": "p", "input": "x", "call_id": ["a"]}]),
        "invalid_type",
        "input[0].call_id",
    ),
    (
        "schema type as list of lists",
        body(
            "hi",
            tools=[
                {"type": "function", "name": "f", "parameters": {"type": [["object"]]}},
            ],
        ),
        "invalid_function_parameters",
        "tools[0].parameters.type",
    ),
    (
        "tool choice unknown",
        body("hi", tool_choice="sometimes"),
        "invalid_value",
        "tool_choice",
    ),
    (
        "type nested deep",
        {"model": "sim-model", "input": [{"type": nested_value(100)}]},
        "nesting_too_deep",
        "input[0].type" + ".a" * (MAX_JSON_DEPTH - 3),
    ),
    (
        "pass-through tool nested deep (was a RecursionError)",
        body("hi", tools=[{"type": "web_search", "x": nested_value(200)}]),
        "nesting_too_deep",
        "tools[0].x" + ".a" * (MAX_JSON_DEPTH - 3),
    ),
    (
        "metadata key too long",
        body("hi", metadata={"k" * 65: "v"}),
        "invalid_value",
        "metadata",
    ),
    ("metadata value type", body("hi", metadata={"k": 1}), "invalid_type", "metadata.k"),
]


@pytest.fixture
async def http(http_server: RunningServer) -> Any:
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{http_server.http_port}", timeout=10
    ) as client:
        yield client


@pytest.mark.parametrize(("name", "request_body", "code", "param"), BAD, ids=[b[0] for b in BAD])
async def test_http_refuses_with_code_and_param(
    http: httpx.AsyncClient, name: str, request_body: dict[str, Any], code: str, param: str
) -> None:
    async with asyncio.timeout(20):
        reply = await http.post("/v1/responses", content=orjson.dumps(request_body))
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert (error["code"], error["param"]) == (code, param), error


async def test_websocket_refuses_every_row_and_keeps_serving(http_server: RunningServer) -> None:
    assert http_server.http_port is not None
    connect = connector(http_server.http_port)
    async with asyncio.timeout(60), connect() as sock:
        for name, request_body, code, param in BAD:
            await sock.send({"type": "response.create", **request_body})
            error = error_of(await sock.turn())
            assert (error["code"], error["param"]) == (code, param), name
        # A 'type' nested 1,000 deep (orjson parses it; the core refuses it) and 2,000 deep
        # (past the JSON parser's own limit): both are errors, and the socket stays open.
        for depth, expected in ((1000, "nesting_too_deep"), (2000, "invalid_json")):
            await sock.send('{"type":' + "[" * depth + "]" * depth + "}")
            assert error_of(await sock.turn())["code"] == expected
        done = await sock.create(**body("hi"))
        assert done[-1]["type"] == "response.completed"


async def test_grpc_refuses_what_protobuf_can_carry(client: AsyncResponsesClient) -> None:
    """Rows a gRPC client can express (the message fields are typed; Structs are not)."""
    # Typed fields cannot hold a list or an object, and nesting past the decode bound is
    # refused while decoding (tests/hostile/test_grpc_decode.py).
    skip = ("as list", "as object", "metadata value", "nested deep")
    rows = [b for b in BAD if not any(s in b[0] for s in skip)]
    async with asyncio.timeout(60), client.connect() as stream:
        for name, request_body, code, param in rows:
            with pytest.raises(ResponsesError) as caught:
                await stream.create(**request_body)
            assert (caught.value.code, caught.value.param) == (code, param), name
        assert (await stream.create(**body("hi"))).status == "completed"


@pytest.mark.parametrize("path", ["/v1/responses/input_tokens", "/v1/responses/compact"])
async def test_other_body_routes_apply_the_same_limit(http: httpx.AsyncClient, path: str) -> None:
    async with asyncio.timeout(20):
        deep = {"model": "sim-model", "input": [{"type": nested_value(100)}]}
        reply = await http.post(path, content=orjson.dumps(deep))
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["code"] == "nesting_too_deep"


async def test_json_cannot_carry_infinity(http: httpx.AsyncClient) -> None:
    # Infinity in a Struct is refused naming the field (test_grpc_decode.py); in JSON text a
    # number that overflows to infinity is not JSON at all.
    async with asyncio.timeout(20):
        raw = b'{"model":"sim-model","input":"hi","temperature":1e999}'
        reply = await http.post("/v1/responses", content=raw)
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_json"


async def test_fourteen_schema_levels_are_accepted_everywhere(
    http: httpx.AsyncClient, client: AsyncResponsesClient
) -> None:
    """The most that every gRPC client can read back (tests/hostile/test_deep_echo.py)."""
    tool = {"type": "function", "name": "deep", "parameters": nested_schema(14)}
    async with asyncio.timeout(20):
        reply = await http.post("/v1/responses", json=body("hi", tools=[tool]))
        assert reply.status_code == 200, reply.text
        assert reply.json()["tools"][0]["parameters"] == tool["parameters"]
        response = await client.create(**body("hi", tools=[tool]))
        assert response.status == "completed"


async def test_a_call_whose_arguments_are_not_json_comes_back_as_it_went(
    http: httpx.AsyncClient, client: AsyncResponsesClient
) -> None:
    """A real model can write anything as a call's arguments (a small one writes text); a
    client that sends its history back must not be refused for the model's own words."""
    call = {**CALL, "arguments": "Hello world."}
    output = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    history = [msg(), call, output]
    async with asyncio.timeout(20):
        reply = await http.post(
            "/v1/responses", json={**body(history, tools=[SHELL_TOOL]), "store": True}
        )
        assert reply.status_code == 200, reply.text
        stored = await http.get(f"/v1/responses/{reply.json()['id']}/input_items?order=asc")
        calls = [i for i in stored.json()["data"] if i["type"] == "function_call"]
        assert [c["arguments"] for c in calls] == ["Hello world."]
        async with client.connect() as stream:
            response = await stream.create(**body(history, tools=[SHELL_TOOL]))
            assert response.status == "completed"
