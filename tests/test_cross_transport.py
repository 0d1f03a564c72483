"""One table of request sequences, run over gRPC, WebSocket, HTTP and HTTP+SSE.

Each scenario is a list of steps: a request (which may refer to earlier steps' responses) and
its expected outcome. Every transport must reach the expected outcomes and the *same*
normalized results: output items, usage (``cached_tokens`` included: it is the prompt prefix
shared with the previous response's context, however that context was found), statuses, error
codes and params. Ids and timestamps differ by nature.

The stateful transports chain through their connection cache; HTTP chains through the store
(``store`` defaults to true), so the table also checks that both ways of resolving
``previous_response_id`` rebuild the same conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from bidi_responses.client import AsyncResponsesClient, ResponsesError
from bidi_responses.server.app import RunningServer

from tests.conftest import SHELL_TOOL, ServerFactory
from tests.http.conftest import parse_sse
from tests.ws.conftest import connector

Body = dict[str, Any]
# (operation, body) -> outcome; operations: "create", "compact", "input_tokens", "models".
Run = Callable[[str, Body], Awaitable["Outcome"]]


@dataclass(slots=True)
class Outcome:
    """What one step came to: a response object (or the compaction, token count or model
    list of the other operations) or an error (code, param)."""

    response: dict[str, Any] | None = None
    error: tuple[str | None, str | None] | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """One create: ``body(previous outcomes)`` and the expected status or error code."""

    body: Callable[[list[Outcome]], Body]
    expect: str
    param: str | None = None
    op: str = "create"


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named sequence of steps, run on one fresh connection of each transport."""

    name: str
    steps: list[Step] = field(default_factory=list)
    # Transports that cannot express the scenario (None: all of them).
    skip: frozenset[str] = frozenset()


def _response(outcomes: list[Outcome], index: int) -> dict[str, Any]:
    response = outcomes[index].response
    assert response is not None, f"step {index} has no response"
    return response


def answer_calls(index: int, output: str = "a.txt\nb.txt") -> Callable[[list[Outcome]], Body]:
    """A continuation of step ``index`` answering each of its function calls."""

    def body(outcomes: list[Outcome]) -> Body:
        parent = _response(outcomes, index)
        calls = [i for i in parent["output"] if i["type"] == "function_call"]
        assert calls, "the parent step made no function call"
        return {
            "model": "sim-model",
            "tools": [SHELL_TOOL],
            "previous_response_id": parent["id"],
            "input": [
                {"type": "function_call_output", "call_id": c["call_id"], "output": output}
                for c in calls
            ],
        }

    return body


def fixed(**body: Any) -> Callable[[list[Outcome]], Body]:
    """A request that does not depend on earlier steps."""
    return lambda _outcomes: {"model": "sim-model", **body}


def after(index: int, **body: Any) -> Callable[[list[Outcome]], Body]:
    """A request continuing step ``index``."""
    return lambda outcomes: {
        "model": "sim-model",
        "previous_response_id": _response(outcomes, index)["id"],
        **body,
    }


def compacted(index: int, **body: Any) -> Callable[[list[Outcome]], Body]:
    """A create whose input is step ``index``'s compacted output plus ``input`` items."""

    extra = body.pop("input", [])

    def make(outcomes: list[Outcome]) -> Body:
        output = list(_response(outcomes, index)["output"])
        return {"model": "sim-model", **body, "input": output + extra}

    return make


POINT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "x": {"type": "integer", "minimum": 0, "maximum": 100},
        "label": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
    },
    "required": ["x", "label", "tags"],
}
POINT_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "name": "point",
    "strict": True,
    "schema": {**POINT_SCHEMA, "additionalProperties": False},
}
# The same without additionalProperties: fine when not strict, refused when strict.
LOOSE_FORMAT: dict[str, Any] = {**POINT_FORMAT, "strict": False, "schema": POINT_SCHEMA}
FORGED = {"type": "compaction", "encrypted_content": "c2VydmVyIGRpZCBub3QgbWFrZSB0aGlz"}

TOOLS = [SHELL_TOOL]
BAD_SCHEMA_TOOL = {"type": "function", "name": "broken", "parameters": {"type": "string"}}

SCENARIOS = [
    Scenario("plain_text", [Step(fixed(input="hello there"), "completed")]),
    Scenario(
        "instructions_and_metadata",
        [
            Step(
                fixed(
                    input="hi",
                    instructions="Answer briefly.",
                    metadata={"run": "7"},
                    temperature=0.2,
                ),
                "completed",
            ),
            Step(after(0, input="and more?", instructions="Answer briefly."), "completed"),
        ],
    ),
    Scenario(
        "tool_call_then_output",
        [
            Step(fixed(input="list the files", tools=TOOLS), "completed"),
            Step(answer_calls(0), "completed"),
        ],
    ),
    Scenario(
        "full_tool_loop",
        [
            Step(fixed(input="fix the failing test", tools=TOOLS), "completed"),
            Step(answer_calls(0), "completed"),
            Step(answer_calls(1), "completed"),
            Step(answer_calls(2), "completed"),
            Step(after(3, input="thanks, one more thing", tools=TOOLS), "completed"),
        ],
    ),
    Scenario(
        "unknown_previous_response",
        [
            Step(
                fixed(input="hi", previous_response_id="resp_does_not_exist"),
                "previous_response_not_found",
                "previous_response_id",
            ),
        ],
    ),
    Scenario(
        "unknown_call_id",
        [
            Step(fixed(input="list the files", tools=TOOLS), "completed"),
            Step(
                after(
                    0,
                    tools=TOOLS,
                    input=[
                        {"type": "function_call_output", "call_id": "call_unknown", "output": "x"}
                    ],
                ),
                "invalid_value",
                "input[0].call_id",
            ),
        ],
    ),
    Scenario(
        "empty_model",
        [
            Step(lambda _: {"model": "", "input": "hi"}, "missing_required_parameter", "model"),
        ],
    ),
    Scenario(
        "malformed_tool_schema",
        [
            Step(
                fixed(input="hi", tools=[BAD_SCHEMA_TOOL]),
                "invalid_function_parameters",
                "tools[0].parameters.type",
            ),
        ],
    ),
    Scenario(
        "out_of_range_value",
        [
            Step(fixed(input="hi", max_output_tokens=5), "invalid_value", "max_output_tokens"),
        ],
    ),
    # A JSON type error cannot be sent over gRPC: protobuf types the field on the client.
    Scenario(
        "wrong_field_type",
        [
            Step(fixed(input="hi", temperature="hot"), "invalid_type", "temperature"),
            Step(fixed(input="hi", max_output_tokens="many"), "invalid_value", "max_output_tokens"),
        ],
        skip=frozenset({"grpc"}),
    ),
    Scenario(
        "warm_up_then_continue",
        [
            Step(
                fixed(
                    generate=False,
                    tools=TOOLS,
                    input=[{"role": "developer", "content": "You are a coding agent."}],
                ),
                "completed",
            ),
            Step(after(0, tools=TOOLS, input="run the tests"), "completed"),
            Step(answer_calls(1), "completed"),
        ],
    ),
    Scenario(
        "max_output_tokens_incomplete",
        [
            Step(fixed(input="write a long answer", max_output_tokens=16), "incomplete"),
        ],
    ),
    Scenario(
        "compact_then_continue",
        [
            Step(fixed(input="fix the failing test", tools=TOOLS), "completed"),
            Step(answer_calls(0), "completed"),
            Step(after(1), "response.compaction", op="compact"),
            Step(
                compacted(2, tools=TOOLS, input=[{"role": "user", "content": "go on"}]),
                "completed",
            ),
            Step(answer_calls(3), "completed"),
            Step(after(4, tools=TOOLS, input="and now?"), "completed"),
        ],
    ),
    Scenario(
        "compact_given_input",
        [
            Step(
                fixed(
                    input=[
                        {"role": "user", "content": "summarize the log"},
                        {"role": "assistant", "content": "The build failed at step 3."},
                    ]
                ),
                "response.compaction",
                op="compact",
            ),
            Step(compacted(0, input=[{"role": "user", "content": "why?"}]), "completed"),
            Step(compacted(0), "response.compaction", op="compact"),
        ],
    ),
    Scenario(
        "compact_errors",
        [
            Step(lambda _: {"input": "hi"}, "missing_required_parameter", "model", op="compact"),
            Step(fixed(input="hi", model="nope"), "model_not_found", "model", op="compact"),
            Step(
                fixed(previous_response_id="resp_missing"),
                "previous_response_not_found",
                "previous_response_id",
                op="compact",
            ),
            Step(
                fixed(input=[FORGED]),
                "invalid_encrypted_content",
                "input[0].encrypted_content",
                op="compact",
            ),
        ],
    ),
    Scenario(
        "forged_compaction_item",
        [Step(fixed(input=[FORGED]), "invalid_encrypted_content", "input[0].encrypted_content")],
    ),
    Scenario(
        "input_tokens_equal_usage",
        [
            Step(
                fixed(input="list the files", tools=TOOLS, instructions="Be brief."),
                "response.input_tokens",
                op="input_tokens",
            ),
            Step(fixed(input="list the files", tools=TOOLS, instructions="Be brief."), "completed"),
            Step(answer_calls(1), "response.input_tokens", op="input_tokens"),
            Step(answer_calls(1), "completed"),
            Step(
                fixed(input="a point", text={"format": POINT_FORMAT}),
                "response.input_tokens",
                op="input_tokens",
            ),
            Step(fixed(input="a point", text={"format": POINT_FORMAT}), "completed"),
        ],
    ),
    Scenario("models", [Step(fixed(), "list", op="models")]),
    Scenario(
        "structured_outputs",
        [
            Step(
                fixed(
                    input="a point",
                    text={"format": POINT_FORMAT, "verbosity": "low"},
                    reasoning={"effort": "low", "summary": "auto"},
                    truncation="auto",
                    include=["reasoning.encrypted_content"],
                    max_tool_calls=4,
                ),
                "completed",
            ),
            Step(after(0, input="another", text={"format": LOOSE_FORMAT}), "completed"),
            Step(after(1, input="as JSON", text={"format": {"type": "json_object"}}), "completed"),
        ],
    ),
    Scenario(
        "structured_output_errors",
        [
            Step(
                fixed(
                    input="x", text={"format": {**POINT_FORMAT, "schema": LOOSE_FORMAT["schema"]}}
                ),
                "invalid_json_schema",
                "text.format.schema.additionalProperties",
            ),
            Step(
                fixed(input="x", text={"format": {"type": "json_schema", "name": "n"}}),
                "missing_required_parameter",
                "text.format.schema",
            ),
            Step(
                fixed(input="x", text={"format": {"type": "json_schema", "schema": {}}}),
                "missing_required_parameter",
                "text.format.name",
            ),
            Step(fixed(input="x", truncation="sometimes"), "invalid_value", "truncation"),
            Step(fixed(input="x", include=["everything"]), "invalid_value", "include[0]"),
        ],
    ),
    # Fields the protobuf does not have cannot be sent over gRPC.
    Scenario(
        "unsupported_parameters",
        [
            Step(fixed(input="x", conversation="conv_1"), "unsupported_parameter", "conversation"),
            Step(fixed(input="x", top_logprobs=3), "unsupported_parameter", "top_logprobs"),
        ],
        skip=frozenset({"grpc"}),
    ),
    # Background mode: HTTP, and gRPC's unary CreateResponse (tests/grpc/test_surface.py);
    # a Connect stream refuses it as a WebSocket does.
    Scenario(
        "background",
        [
            Step(fixed(input="list the files", tools=TOOLS, background=True), "completed"),
            Step(answer_calls(0), "completed"),
            Step(lambda outcomes: {**answer_calls(1)(outcomes), "background": True}, "completed"),
        ],
        skip=frozenset({"grpc", "websocket"}),
    ),
    Scenario(
        "background_refused_on_streams",
        [
            Step(fixed(input="hi", background=True), "unsupported_parameter", "background"),
            Step(fixed(input="hi"), "completed"),
        ],
        skip=frozenset({"http", "http-sse"}),
    ),
    Scenario(
        "error_then_recovery",
        [
            Step(fixed(input="list the files", tools=TOOLS), "completed"),
            Step(
                fixed(input="hi", previous_response_id="resp_missing"),
                "previous_response_not_found",
                "previous_response_id",
            ),
            Step(answer_calls(0), "completed"),
        ],
    ),
]


# -- transports ------------------------------------------------------------------------------


def _from_error(code: str | None, param: str | None) -> Outcome:
    return Outcome(error=(code, param))


@contextlib.asynccontextmanager
async def grpc_connect(server: RunningServer) -> AsyncIterator[Run]:
    """A gRPC Connect stream (the connection cache)."""
    async with (
        AsyncResponsesClient(f"127.0.0.1:{server.grpc_port}") as client,
        client.connect() as stream,
    ):

        async def run(op: str, body: Body) -> Outcome:
            try:
                if op == "compact":
                    return Outcome(response=await client.compact(**body))
                if op == "input_tokens":
                    count = await client.count_input_tokens(**body)
                    return Outcome(response={"object": "response.input_tokens", "count": count})
                if op == "models":
                    return Outcome(response={"object": "list", "data": await client.list_models()})
                return Outcome(response=(await stream.create(**body)).raw)
            except ResponsesError as error:
                return _from_error(error.code, error.param)

        yield run


@contextlib.asynccontextmanager
async def websocket(server: RunningServer) -> AsyncIterator[Run]:
    """A WebSocket-mode connection (the connection cache)."""
    assert server.http_port is not None
    async with (
        connector(server.http_port)() as sock,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http,
    ):

        async def run(op: str, body: Body) -> Outcome:
            if op != "create":  # WebSocket mode carries creates only: the rest is HTTP
                return await _http_op(http, op, body)
            last = (await sock.create(**body))[-1]
            if last["type"] == "error":
                return _from_error(last["error"]["code"], last["error"]["param"])
            return Outcome(response=last["response"])

        yield run


@contextlib.asynccontextmanager
async def http_json(server: RunningServer) -> AsyncIterator[Run]:
    """Plain HTTP: each create stands alone; continuations resolve from the store."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http:

        async def run(op: str, body: Body) -> Outcome:
            return await _http_op(http, op, body)

        yield run


async def _http_op(http: httpx.AsyncClient, op: str, body: Body) -> Outcome:
    if op == "models":
        reply = await http.get("/v1/models")
    else:
        path = {"create": "/v1/responses", "compact": "/v1/responses/compact"}
        reply = await http.post(path.get(op, "/v1/responses/input_tokens"), json=body)
    if reply.status_code != 200:
        error = reply.json()["error"]
        return _from_error(error["code"], error["param"])
    result = reply.json()
    if op == "input_tokens":
        result = {"object": result["object"], "count": result["input_tokens"]}
    while result.get("background") and result["status"] in ("queued", "in_progress"):
        # A background response answers at once; poll it to its end.
        await asyncio.sleep(0.01)
        result = (await http.get(f"/v1/responses/{result['id']}")).json()
    return Outcome(response=result)


@contextlib.asynccontextmanager
async def http_sse(server: RunningServer) -> AsyncIterator[Run]:
    """HTTP with ``stream: true``: the terminal SSE event carries the response."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http:

        async def run(op: str, body: Body) -> Outcome:
            if op != "create":
                return await _http_op(http, op, body)
            reply = await http.post("/v1/responses", json={**body, "stream": True})
            if reply.status_code != 200:
                error = reply.json()["error"]
                return _from_error(error["code"], error["param"])
            return Outcome(response=parse_sse(reply.content)[-1]["response"])

        yield run


TRANSPORTS: dict[str, Callable[[RunningServer], contextlib.AbstractAsyncContextManager[Run]]] = {
    "grpc": grpc_connect,
    "websocket": websocket,
    "http": http_json,
    "http-sse": http_sse,
}


# -- comparison ------------------------------------------------------------------------------


def _item(item: dict[str, Any]) -> dict[str, Any]:
    kind = item["type"]
    if kind == "message":
        return {
            "type": kind,
            "role": item["role"],
            "status": item.get("status"),
            "text": [part.get("text") for part in item["content"]],
        }
    if kind == "function_call":
        return {
            "type": kind,
            "name": item["name"],
            "arguments": item["arguments"],
            "status": item.get("status"),
        }
    if kind == "compaction":
        # Tokens differ by nature (each is sealed afresh); their content shows in the
        # next step's usage, which renders the summary they carry.
        return {"type": kind, "sealed": bool(item["encrypted_content"])}
    return {"type": kind}


def normalize(outcomes: list[Outcome]) -> list[Any]:
    """Outcomes without ids and times; chains as step indexes."""
    ids = {
        o.response["id"]: i
        for i, o in enumerate(outcomes)
        if o.response is not None and "id" in o.response
    }
    result: list[Any] = []
    for outcome in outcomes:
        if outcome.response is None:
            result.append({"error": outcome.error})
            continue
        r = outcome.response
        if r.get("object") != "response":
            result.append(_other(r))
            continue
        usage = r["usage"]
        result.append(
            {
                "status": r["status"],
                "incomplete_details": r.get("incomplete_details"),
                "error": r.get("error"),
                "previous_step": ids.get(r["previous_response_id"], r["previous_response_id"]),
                "model": r["model"],
                "instructions": r.get("instructions"),
                "metadata": r.get("metadata") or {},
                "tools": [t["name"] for t in r.get("tools") or []],
                "max_output_tokens": r.get("max_output_tokens"),
                "temperature": r.get("temperature"),
                "text": r["text"],
                "reasoning": r["reasoning"],
                "truncation": r["truncation"],
                "max_tool_calls": r["max_tool_calls"],
                "output": [_item(item) for item in r["output"]],
                "usage": {
                    key: usage[key] for key in ("input_tokens", "output_tokens", "total_tokens")
                }
                | {"cached_tokens": usage["input_tokens_details"]["cached_tokens"]},
            }
        )
    return result


def _other(r: dict[str, Any]) -> dict[str, Any]:
    """A compaction, token count or model list without ids and times."""
    if r["object"] == "response.compaction":
        return {
            "object": r["object"],
            "output": [
                _item(item) if item["type"] != "message" else {**_item(item), "role": item["role"]}
                for item in r["output"]
            ],
            "usage": r["usage"],
        }
    if r["object"] == "list":
        return {"object": "list", "models": [(m["id"], m["owned_by"]) for m in r["data"]]}
    return dict(r)


async def run_scenario(server: RunningServer, transport: str, scenario: Scenario) -> list[Outcome]:
    """Run every step on one fresh connection of ``transport``; check each expectation."""
    outcomes: list[Outcome] = []
    async with TRANSPORTS[transport](server) as run:
        for index, step in enumerate(scenario.steps):
            outcome = await run(step.op, step.body(outcomes))
            where = f"{transport} step {index}"
            if outcome.response is not None:
                response = outcome.response
                assert response.get("status", response["object"]) == step.expect, where
            else:
                assert outcome.error == (step.expect, step.param), where
            outcomes.append(outcome)
    return outcomes


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_same_results_on_every_transport(
    server_factory: ServerFactory, scenario: Scenario
) -> None:
    server: RunningServer = await server_factory(http=True)
    async with asyncio.timeout(30):
        results = {
            name: normalize(await run_scenario(server, name, scenario))
            for name in TRANSPORTS
            if name not in scenario.skip
        }
    reference_name, reference = next(iter(results.items()))
    for name, result in results.items():
        assert result == reference, f"{name} differs from {reference_name} in {scenario.name}"
