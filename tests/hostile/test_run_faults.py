"""Inputs a hostile run found turning into a 500 or INTERNAL: each is now a 4xx, an
INVALID_ARGUMENT or NOT_FOUND, or an error event naming the field, on every transport, and
nothing is logged as an ERROR.

Real servers on loopback; real clients: httpx and the openai SDK over HTTP, raw WebSocket
frames, stock grpcio stubs (no deep-reply decoding, no project codec on the reply side) and
the project's client.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import httpx
import openai
import pytest
from bidi_responses.client import AsyncResponsesClient, ResponsesError
from bidi_responses.codec import params_to_pb
from bidi_responses.server.app import RunningServer
from bidi_responses.server.core.api.errors import ApiError
from bidi_responses.server.transports.grpc.status import to_status
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ws.conftest import connector, error_of

BASE: dict[str, Any] = {"model": "sim-model", "input": "hi", "store": False}
OBJECT: dict[str, Any] = {"value": "high"}
ARRAY: list[Any] = ["high"]


def _set(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """BASE with ``value`` at ``path`` (objects created on the way)."""
    body = dict(BASE)
    target = body
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value
    return body


# Every closed-set field of a create, given an object and an array.
CLOSED_FIELDS = [
    ("truncation",),
    ("text", "verbosity"),
    ("reasoning", "effort"),
    ("reasoning", "summary"),
]
CLOSED_CASES = [
    (".".join(path), _set(path, value)) for path in CLOSED_FIELDS for value in (OBJECT, ARRAY)
] + [
    ("text.format.type", _set(("text", "format"), {"type": OBJECT})),
    ("include", _set(("include",), [ARRAY])),
    ("tool_choice", _set(("tool_choice",), [OBJECT])),
]


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    return _set(
        ("text", "format"), {"type": "json_schema", "name": "out", "strict": True, "schema": schema}
    )


def _closed_object(**extra: Any) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": {}, "required": []} | (
        extra
    )


# Strict-mode keywords of a shape the schema checks did not read before: a 500 each.
STRICT_CASES = [
    ("text.format.schema.anyOf", _strict(_closed_object(anyOf=5))),
    ("text.format.schema.$defs", _strict(_closed_object(**{"$defs": [1]}))),
    (
        "text.format.schema.$defs.d.required",
        _strict(_closed_object(**{"$defs": {"d": _closed_object(required=5)}})),
    ),
    (
        "text.format.schema.$defs.d.properties",
        _strict(_closed_object(**{"$defs": {"d": _closed_object(properties=[1])}})),
    ),
]

CUSTOM_CALL = {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "x"}


def _custom_output(output: list[Any]) -> dict[str, Any]:
    out = {"type": "custom_tool_call_output", "call_id": "c1", "output": output}
    return _set(("input",), [CUSTOM_CALL, out])


OUTPUT_CASES = [
    ("input[1].output[0]", _custom_output([1, "x", None])),
    ("input[1].output[1]", _custom_output([{"type": "input_text", "text": "ok"}, "x"])),
    ("input[1].output[0].text", _custom_output([{"type": "input_text", "text": {"a": 1}}])),
]

NEWLINE_TOOL = {
    "type": "function",
    "name": "f",
    "parameters": {"type": "object", "properties": {"a\nb": {"type": "bogus"}}},
}
NEWLINE_PARAM = "tools[0].parameters.properties.a\nb.type"

HTTP_CASES = CLOSED_CASES + STRICT_CASES + OUTPUT_CASES
# What a typed gRPC message can carry: free JSON travels in Structs (schemas, pass-through
# items), closed-set fields are strings.
GRPC_CASES = STRICT_CASES + OUTPUT_CASES


@pytest.fixture
def errors_logged(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The ERROR records logged during the test (a client fault must log none)."""
    caplog.set_level(logging.INFO)
    return caplog.records


def _no_errors(records: list[logging.LogRecord]) -> None:
    bad = [f"{r.name}: {r.getMessage()}" for r in records if r.levelno >= logging.ERROR]
    assert not bad, bad


@pytest.fixture
async def http(http_server: RunningServer) -> Any:
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{http_server.http_port}", timeout=10
    ) as client:
        yield client


@pytest.mark.parametrize(("param", "body"), HTTP_CASES, ids=[c[0] for c in HTTP_CASES])
async def test_http_and_token_counts_answer_400_naming_the_field(
    http: httpx.AsyncClient, errors_logged: list[logging.LogRecord], param: str, body: Any
) -> None:
    async with asyncio.timeout(20):
        for path in ("/v1/responses", "/v1/responses/input_tokens"):
            reply = await http.post(path, json=body)
            assert reply.status_code == 400, (path, reply.text)
            assert reply.json()["error"]["param"] == param, (path, reply.text)
    _no_errors(errors_logged)


async def test_openai_sdk_gets_a_bad_request_error(sdk: openai.AsyncOpenAI) -> None:
    async with asyncio.timeout(20):
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.responses.create(model="sim-model", input="hi", extra_body={"truncation": {}})
        assert caught.value.param == "truncation"
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.responses.input_tokens.count(
                model="sim-model",
                input="hi",
                extra_body={"reasoning": {"effort": ["low"]}},
            )
        assert caught.value.param == "reasoning.effort"


async def test_websocket_error_events_name_the_field(
    http_server: RunningServer, errors_logged: list[logging.LogRecord]
) -> None:
    assert http_server.http_port is not None
    async with asyncio.timeout(60), connector(http_server.http_port)() as sock:
        for param, body in HTTP_CASES:
            await sock.send({"type": "response.create", **body})
            error = error_of(await sock.turn())
            assert error["param"] == param, (param, error)
            assert error["code"] != "server_error", error
        done = await sock.create(**BASE)
        assert done[-1]["type"] == "response.completed"
    _no_errors(errors_logged)


@pytest.fixture
async def stub(server: RunningServer) -> Any:
    """A stock grpcio stub: replies decoded by the generated code alone."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        yield pb_grpc.ResponsesServiceStub(channel)


async def _create_status(stub: Any, body: dict[str, Any]) -> grpc.aio.AioRpcError:
    call = stub.CreateResponse(pb.CreateResponseRequest(params=params_to_pb(body)))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in call:
            pass
    return caught.value


async def _count_status(stub: Any, body: dict[str, Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.CountInputTokens(pb.CountInputTokensRequest(params=params_to_pb(body)))
    return caught.value


def _trailer(error: grpc.aio.AioRpcError, key: str) -> str:
    return str(dict(error.trailing_metadata() or ())[key])


@pytest.mark.parametrize(("param", "body"), GRPC_CASES, ids=[c[0] for c in GRPC_CASES])
async def test_grpc_answers_invalid_argument_naming_the_field(
    stub: Any,
    client: AsyncResponsesClient,
    errors_logged: list[logging.LogRecord],
    param: str,
    body: dict[str, Any],
) -> None:
    async with asyncio.timeout(20):
        for error in (await _create_status(stub, body), await _count_status(stub, body)):
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
            assert _trailer(error, "error-param") == param
        async with client.connect() as stream:
            with pytest.raises(ResponsesError) as caught:
                await stream.create(**body)
            assert caught.value.param == param
            assert (await stream.create(**BASE)).status == "completed"
    _no_errors(errors_logged)


async def test_grpc_closed_set_strings_name_the_field(stub: Any) -> None:
    async with asyncio.timeout(20):
        for path in CLOSED_FIELDS:
            body = _set(path, "bogus\nvalue")
            for error in (await _create_status(stub, body), await _count_status(stub, body)):
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
                assert _trailer(error, "error-param") == ".".join(path)
                assert "'bogus\\nvalue'" in (error.details() or "")


async def test_a_newline_in_a_schema_property_name_is_a_readable_invalid_argument(
    stub: Any, errors_logged: list[logging.LogRecord]
) -> None:
    """The field path went raw into the ``error-param`` trailer: INTERNAL "Invalid metadata",
    then "Abort already called!" in the log."""
    body = {**BASE, "tools": [NEWLINE_TOOL]}
    async with asyncio.timeout(20):
        for error in (await _create_status(stub, body), await _count_status(stub, body)):
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
            assert _trailer(error, "error-param") == NEWLINE_PARAM.replace("\n", "\\n")
            details = error.details() or ""
            assert "properties.a\\nb.type" in details and "'bogus'" in details
    _no_errors(errors_logged)


LONG_ID = "resp_" + "x" * 5000


async def test_very_long_ids_are_not_found_with_the_id_cut(
    stub: Any, http: httpx.AsyncClient, errors_logged: list[logging.LogRecord]
) -> None:
    """A 5,000-character id was echoed whole into the status (10 KB of metadata), which the
    client refused as RESOURCE_EXHAUSTED."""
    calls = [
        stub.GetResponse(pb.GetResponseRequest(response_id=LONG_ID)),
        stub.DeleteResponse(pb.DeleteResponseRequest(response_id=LONG_ID)),
        stub.CancelResponse(pb.CancelResponseRequest(response_id=LONG_ID)),
        stub.ListInputItems(pb.ListInputItemsRequest(response_id=LONG_ID)),
        stub.GetModel(pb.GetModelRequest(model=LONG_ID)),
    ]
    async with asyncio.timeout(20):
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            error = caught.value
            assert error.code() == grpc.StatusCode.NOT_FOUND, error
            details = error.details() or ""
            assert len(details) < 400 and "5005 characters" in details, details
            size = sum(len(k) + len(v) for k, v in error.trailing_metadata() or ())
            assert size < 2048, size
        stream = stub.StreamResponse(pb.StreamResponseRequest(response_id=LONG_ID))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in stream:
                pass
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        for method, path in [
            ("GET", f"/v1/responses/{LONG_ID}"),
            ("DELETE", f"/v1/responses/{LONG_ID}"),
            ("GET", f"/v1/responses/{LONG_ID}/input_items"),
            ("POST", f"/v1/responses/{LONG_ID}/cancel"),
            ("GET", f"/v1/models/{LONG_ID}"),
        ]:
            reply = await http.request(method, path)
            assert reply.status_code == 404, (path[:40], reply.text[:200])
            assert len(reply.json()["error"]["message"]) < 400
        reply = await http.post("/v1/responses", json={**BASE, "previous_response_id": LONG_ID})
        assert reply.status_code == 400 and len(reply.json()["error"]["message"]) < 400
    _no_errors(errors_logged)


async def test_a_control_character_id_is_not_found_with_the_id_escaped(stub: Any) -> None:
    async with asyncio.timeout(20):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetResponse(pb.GetResponseRequest(response_id="resp_a\r\nb\x00"))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert "resp_a\\r\\nb\\x00" in (caught.value.details() or "")


texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=6000)


@settings(max_examples=200, deadline=None)
@given(param=texts, message=texts, code=texts)
def test_every_status_is_sendable(param: str, message: str, code: str) -> None:
    """Whatever an error quotes, its plain trailers are printable ASCII and bounded, and the
    whole status stays far below grpcio's 8 KiB metadata limit."""
    status = to_status(ApiError(message, code=code or "x", param=param or None))
    size = len(status.details.encode())
    for key, value in status.trailing_metadata:
        if key.endswith("-bin"):
            assert isinstance(value, bytes)
            size += len(value) * 4 // 3  # sent base64-encoded
        else:
            assert isinstance(value, str) and len(value) <= 256
            assert all(" " <= c <= "~" for c in value), (key, value)
            size += len(value)
    assert size < 4096


async def test_cancelling_a_finished_response_that_was_not_in_the_background(
    http: httpx.AsyncClient, http_server: RunningServer
) -> None:
    """The hosted API cancels only background responses: a finished foreground one is a 400
    (HTTP) and FAILED_PRECONDITION (gRPC CancelResponse, which names an in-flight response)."""
    async with asyncio.timeout(20):
        done = (await http.post("/v1/responses", json={**BASE, "store": True})).json()
        assert done["status"] == "completed"
        reply = await http.post(f"/v1/responses/{done['id']}/cancel")
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["code"] == "response_not_cancellable"
        assert "Only background responses can be cancelled" in error["message"]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{http_server.grpc_port}") as channel:
            grpc_stub = pb_grpc.ResponsesServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await grpc_stub.CancelResponse(pb.CancelResponseRequest(response_id=done["id"]))
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        # Still completed: the refusal changed nothing.
        assert (await http.get(f"/v1/responses/{done['id']}")).json()["status"] == "completed"
        # A finished background response: cancelling it again answers it as it ended.
        queued = (
            await http.post("/v1/responses", json={**BASE, "store": True, "background": True})
        ).json()
        # Its events, followed live to the end (background mode's resume).
        replay = await http.get(f"/v1/responses/{queued['id']}", params={"stream": "true"})
        assert b"response.completed" in replay.content
        again = await http.post(f"/v1/responses/{queued['id']}/cancel")
        assert again.status_code == 200 and again.json()["status"] == "completed"
