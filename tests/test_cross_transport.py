"""One table of request sequences, run over gRPC, WebSocket, HTTP and HTTP+SSE.

Each scenario is a list of steps: a request (which may refer to earlier steps' responses) and
its expected outcome. Every transport must reach the expected outcomes and the *same*
normalized results: output items, usage (``cached_tokens`` included: it is the prompt prefix
shared with the previous response's context, however that context was found), statuses, error
codes and params. Ids and timestamps differ by nature.

The stateful transports chain through their connection cache; HTTP chains through the store
(``store`` defaults to true), so the table also checks that both ways of resolving
``previous_response_id`` rebuild the same conversation.

Lanes and steering exist on the two streams only (gRPC ``Connect`` through the project's
client, WebSocket mode through raw frames): a create on a busy lane, a fork across lanes, the
33rd lane, and steering (accepted, refused, pending). Those steps also compare the order of the
lifecycle and steering events they saw, and the responses that followed (the successor).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from bidi_responses.client import (
    AsyncResponsesClient,
    ConnectStream,
    NoSuccessor,
    Response,
    ResponsesError,
)
from bidi_responses.codec import params_to_pb
from bidi_responses.server.app import RunningServer
from bidi_responses.v1 import responses_pb2 as pb

from tests.conftest import SHELL_TOOL, ServerFactory
from tests.http.conftest import parse_sse
from tests.ws.conftest import RawSocket, connector

Body = dict[str, Any]
# (operation, body) -> outcome; operations: "create", "compact", "input_tokens", "models",
# and on the streams only "queued_pair", "fill_lanes" and "steer" (see ``STREAM_OPS``).
Run = Callable[[str, Body], Awaitable["Outcome"]]
#: The transports with lanes and steering.
STREAMS = frozenset({"grpc", "websocket"})
NOT_STREAMS = frozenset({"http", "http-sse"})
#: Lifecycle and steering events whose order a stream step compares (deltas and items vary
#: with timing; these do not).
_ORDERED = frozenset(
    {
        "response.queued",
        "response.created",
        "response.completed",
        "response.failed",
        "response.incomplete",
        "response.steer.accepted",
        "response.steer.failed",
        "response.steer.pending",
        "error",
    }
)
_TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete"})
# WebSocket mode keeps the hosted API's names for limits that Connect names neutrally.
_NEUTRAL_CODES = {"websocket_stream_limit_reached": "stream_limit_reached"}


@dataclass(slots=True)
class Outcome:
    """What one step came to: a response object (or the compaction, token count or model
    list of the other operations) or an error (code, param)."""

    response: dict[str, Any] | None = None
    error: tuple[str | None, str | None] | None = None
    # Stream steps: the lifecycle and steering events seen, in order (a steering failure as
    # "type:code"), and the step's other responses (a successor; the first of a queued pair).
    events: list[str] | None = None
    follow: list[dict[str, Any]] = field(default_factory=list)


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
    # Simulated-engine settings of the scenario's server (steering needs time to land).
    sim: dict[str, Any] = field(default_factory=dict)


def _response(outcomes: list[Outcome], index: int) -> dict[str, Any]:
    response = outcomes[index].response
    assert response is not None, f"step {index} has no response"
    return response


def answer_calls(
    index: int, output: str = "a.txt\nb.txt", **extra: Any
) -> Callable[[list[Outcome]], Body]:
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
            **extra,
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
# The first token comes late, so a steer sent at response.created lands before it.
STEER_MARGIN: dict[str, Any] = {"ttft_ms": 1000, "tokens_per_second": 1000}
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
    # -- lanes and steering (the streams only) ------------------------------------------------
    Scenario(
        "create_on_a_busy_lane_waits_its_turn",
        [
            Step(fixed(input="first", stream_id="a"), "completed", op="queued_pair"),
            Step(after(0, input="and then?", stream_id="a"), "completed"),
        ],
        skip=NOT_STREAMS,
        # The first is still running when the second arrives.
        sim={"ttft_ms": 300},
    ),
    Scenario(
        "fork_across_lanes",
        [
            Step(
                fixed(input="list the files", tools=TOOLS, store=False, stream_id="a"), "completed"
            ),
            Step(answer_calls(0, stream_id="b"), "completed"),
            Step(answer_calls(0, stream_id="a"), "completed"),
        ],
        skip=NOT_STREAMS,
    ),
    Scenario(
        "thirty_third_lane_refused",
        [
            Step(fixed(input="warm", generate=False, store=False), "completed", op="fill_lanes"),
            Step(
                fixed(input="one too many", stream_id="lane-32"),
                "stream_limit_reached",
                "stream_id",
            ),
            Step(fixed(input="still open", stream_id="lane-0"), "completed"),
        ],
        skip=NOT_STREAMS,
    ),
    Scenario(
        "steer_accepted_target_steered_successor_follows",
        [
            Step(
                fixed(input="write a poem", stream_id="s", steer="use tabs", steer_at="created"),
                "incomplete",
                op="steer",
            ),
        ],
        skip=NOT_STREAMS,
        sim=STEER_MARGIN,
    ),
    Scenario(
        "steer_refused_for_bad_input",
        [
            Step(
                fixed(
                    input="write a poem",
                    stream_id="s",
                    steer=[{"type": "function_call_output", "call_id": "c1", "output": "x"}],
                    steer_at="created",
                ),
                "completed",
                op="steer",
            ),
            Step(after(0, input="go on", stream_id="s"), "completed"),
        ],
        skip=NOT_STREAMS,
        sim=STEER_MARGIN,
    ),
    Scenario(
        "steer_pending_until_tool_outputs",
        [
            Step(
                fixed(
                    input="list the files",
                    tools=TOOLS,
                    stream_id="p",
                    steer="only the python files",
                    steer_at="response.function_call_arguments.delta",
                ),
                "completed",
                op="steer",
            ),
            # The explicit continuation: the steering input goes before its tool outputs.
            Step(answer_calls(0, stream_id="p"), "completed"),
        ],
        skip=NOT_STREAMS,
        # The function call streams long enough for the steer to land inside it.
        sim={"tokens_per_second": 50},
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
    return Outcome(error=(_NEUTRAL_CODES.get(code or "", code), param))


# -- lanes and steering on the two streams ----------------------------------------------------


class _GrpcLanes:
    """The stream steps over Connect, through the project's client."""

    def __init__(self, stream: ConnectStream) -> None:
        self.stream = stream

    async def create(self, body: Body) -> Outcome:
        try:
            return Outcome(response=dict((await self.stream.create(**body)).raw))
        except ResponsesError as error:
            return _from_error(error.code, error.param)

    async def queued_pair(self, body: Body) -> Outcome:
        """Two creates sent back to back on one lane, past the client's own turn-taking, so
        the server queues the second; the second's outcome."""
        lane = body.pop("stream_id")
        request = pb.ConnectRequest(stream_id=lane, response_create=params_to_pb(body))
        await self.stream.send(request)
        await self.stream.send(request)
        seen: list[str] = []
        ended: list[dict[str, Any]] = []
        async for event in self.stream.events(lane):
            if event["type"] in _ORDERED:
                seen.append(event["type"])
            if event["type"] in _TERMINAL:
                ended.append(event["response"])
                if len(ended) == 2:
                    break
        return Outcome(response=ended[1], events=seen, follow=[ended[0]])

    async def steer(self, body: Body) -> Outcome:
        """A create steered at its first ``steer_at`` event; then its successor, if any."""
        steering, at = body.pop("steer"), body.pop("steer_at")
        seen: list[str] = []
        target: dict[str, Any] = {}
        async for event in self.stream.create_events(**body):
            kind = event["type"]
            if kind in _ORDERED:
                seen.append(kind)
            if kind == "response.created":
                target = event["response"]
            if kind in _TERMINAL:
                target = event["response"]
            if _steer_now(kind, at, seen):
                ack = await self.stream.steer(previous_response_id=target["id"], input=steering)
                seen.append(ack.raw["type"] + ("" if ack.accepted else f":{ack.code}"))
        outcome = Outcome(response=target, events=seen)
        try:
            successor: Response | None = None
            async for event in self.stream.follow_events(target["id"]):
                if event["type"] in _ORDERED:
                    seen.append(event["type"])
                if event["type"] in _TERMINAL:
                    successor = Response.from_dict(event["response"])
            assert successor is not None
            outcome.follow.append(dict(successor.raw))
        except NoSuccessor as none:
            if none.event.get("type") == "response.steer.pending":
                seen.append("response.steer.pending")
        return outcome


class _WebSocketLanes:
    """The stream steps over WebSocket mode, frame by frame."""

    def __init__(self, sock: RawSocket) -> None:
        self.sock = sock

    async def create(self, body: Body) -> Outcome:
        last = (await self.sock.create(**body))[-1]
        if last["type"] == "error":
            return _from_error(last["error"]["code"], last["error"]["param"])
        return Outcome(response=last["response"])

    async def queued_pair(self, body: Body) -> Outcome:
        event = {"type": "response.create", **body}
        await self.sock.send(event)
        await self.sock.send(event)
        seen: list[str] = []
        ended: list[dict[str, Any]] = []
        while len(ended) < 2:
            frame = await self.sock.recv()
            if frame["type"] in _ORDERED:
                seen.append(frame["type"])
            if frame["type"] in _TERMINAL:
                ended.append(frame["response"])
        return Outcome(response=ended[1], events=seen, follow=[ended[0]])

    async def steer(self, body: Body) -> Outcome:
        steering, at = body.pop("steer"), body.pop("steer_at")
        await self.sock.send({"type": "response.create", **body})
        seen: list[str] = []
        target: dict[str, Any] = {}
        follow: list[dict[str, Any]] = []
        accepted = steered = False
        while True:
            frame = await self.sock.recv()
            kind = frame["type"]
            if kind in _ORDERED and kind != "response.steer.failed":
                seen.append(kind)
            if kind == "response.created" and not target:
                target = frame["response"]
            elif kind == "response.steer.accepted":
                accepted = True
            elif kind == "response.steer.failed":
                seen.append(f"{kind}:{frame['error']['code']}")
                if "id" in frame["steer"]:
                    accepted = False  # returned after acceptance: no successor
            elif kind == "response.steer.pending":
                break
            elif kind in _TERMINAL:
                if frame["response"]["id"] == target["id"]:
                    target = frame["response"]
                    if not accepted:
                        break
                else:
                    follow.append(frame["response"])
                    break
            if not steered and _steer_now(kind, at, seen):
                steered = True
                await self.sock.send(
                    {
                        "type": "response.steer",
                        "previous_response_id": target["id"],
                        "input": steering,
                    }
                )
        return Outcome(response=target, events=seen, follow=follow)


def _steer_now(kind: str, at: str, seen: list[str]) -> bool:
    """Whether event ``kind`` is the first ``at`` event of the step (``"created"``: its
    ``response.created``)."""
    wanted = "response.created" if at == "created" else at
    if kind != wanted:
        return False
    # Only the first: a steer is sent once per step.
    return not any(s.startswith("response.steer") for s in seen) and seen.count(wanted) <= 1


Lanes = _GrpcLanes | _WebSocketLanes


async def _fill_lanes(lanes: Lanes, body: Body) -> Outcome:
    """A create on each of 32 named lanes (the most a stream has); the last one's outcome."""
    outcome = Outcome()
    for index in range(32):
        outcome = await lanes.create({**body, "stream_id": f"lane-{index}"})
    return outcome


async def _queued_pair(lanes: Lanes, body: Body) -> Outcome:
    return await lanes.queued_pair(dict(body))


async def _steer(lanes: Lanes, body: Body) -> Outcome:
    return await lanes.steer(dict(body))


STREAM_OPS: dict[str, Callable[[Lanes, Body], Awaitable[Outcome]]] = {
    "queued_pair": _queued_pair,
    "fill_lanes": _fill_lanes,
    "steer": _steer,
}


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
                if op in STREAM_OPS:
                    return await STREAM_OPS[op](_GrpcLanes(stream), body)
                return Outcome(response=dict((await stream.create(**body)).raw))
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
            if op in STREAM_OPS:
                return await STREAM_OPS[op](_WebSocketLanes(sock), body)
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
        step = _normalized(r, ids)
        if outcome.events is not None:
            # The successor continues this step's response: its own entry names it by step.
            ids[r["id"]] = len(result)
            step["events"] = outcome.events
            step["follow"] = [_normalized(f, ids) for f in outcome.follow]
        result.append(step)
    return result


def _normalized(r: dict[str, Any], ids: dict[str, int]) -> dict[str, Any]:
    """One Response without ids and times."""
    usage = r["usage"]
    return {
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
        "usage": {key: usage[key] for key in ("input_tokens", "output_tokens", "total_tokens")}
        | {"cached_tokens": usage["input_tokens_details"]["cached_tokens"]},
    }


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
    server: RunningServer = await server_factory(http=True, **scenario.sim)
    async with asyncio.timeout(30):
        results = {
            name: normalize(await run_scenario(server, name, scenario))
            for name in TRANSPORTS
            if name not in scenario.skip
        }
    reference_name, reference = next(iter(results.items()))
    for name, result in results.items():
        assert result == reference, f"{name} differs from {reference_name} in {scenario.name}"
