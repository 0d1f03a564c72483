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
Run = Callable[[Body], Awaitable["Outcome"]]


@dataclass(slots=True)
class Outcome:
    """What one create came to: a response object or an error (code, param)."""

    response: dict[str, Any] | None = None
    error: tuple[str | None, str | None] | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """One create: ``body(previous outcomes)`` and the expected status or error code."""

    body: Callable[[list[Outcome]], Body]
    expect: str
    param: str | None = None


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

        async def run(body: Body) -> Outcome:
            try:
                return Outcome(response=(await stream.create(**body)).raw)
            except ResponsesError as error:
                return _from_error(error.code, error.param)

        yield run


@contextlib.asynccontextmanager
async def websocket(server: RunningServer) -> AsyncIterator[Run]:
    """A WebSocket-mode connection (the connection cache)."""
    assert server.http_port is not None
    async with connector(server.http_port)() as sock:

        async def run(body: Body) -> Outcome:
            last = (await sock.create(**body))[-1]
            if last["type"] == "error":
                return _from_error(last["error"]["code"], last["error"]["param"])
            return Outcome(response=last["response"])

        yield run


@contextlib.asynccontextmanager
async def http_json(server: RunningServer) -> AsyncIterator[Run]:
    """Plain HTTP: each create stands alone; continuations resolve from the store."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http:

        async def run(body: Body) -> Outcome:
            reply = await http.post("/v1/responses", json=body)
            if reply.status_code != 200:
                error = reply.json()["error"]
                return _from_error(error["code"], error["param"])
            return Outcome(response=reply.json())

        yield run


@contextlib.asynccontextmanager
async def http_sse(server: RunningServer) -> AsyncIterator[Run]:
    """HTTP with ``stream: true``: the terminal SSE event carries the response."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http:

        async def run(body: Body) -> Outcome:
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
    return {"type": kind}


def normalize(outcomes: list[Outcome]) -> list[Any]:
    """Outcomes without ids and times; chains as step indexes."""
    ids = {o.response["id"]: i for i, o in enumerate(outcomes) if o.response is not None}
    result: list[Any] = []
    for outcome in outcomes:
        if outcome.response is None:
            result.append({"error": outcome.error})
            continue
        r = outcome.response
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
                "output": [_item(item) for item in r["output"]],
                "usage": {
                    key: usage[key] for key in ("input_tokens", "output_tokens", "total_tokens")
                }
                | {"cached_tokens": usage["input_tokens_details"]["cached_tokens"]},
            }
        )
    return result


async def run_scenario(server: RunningServer, transport: str, scenario: Scenario) -> list[Outcome]:
    """Run every step on one fresh connection of ``transport``; check each expectation."""
    outcomes: list[Outcome] = []
    async with TRANSPORTS[transport](server) as run:
        for index, step in enumerate(scenario.steps):
            outcome = await run(step.body(outcomes))
            where = f"{transport} step {index}"
            if outcome.response is not None:
                assert outcome.response["status"] == step.expect, where
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
