"""gRPC counterparts: CompactResponse, CountInputTokens, ListModels, GetModel; compaction items
and structured outputs on a Connect stream."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from bidi_responses.client import AsyncResponsesClient, ResponsesError
from bidi_responses.server.app import RunningServer
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc

from tests.conftest import SHELL_TOOL, ServerFactory, background_config, read_message

TOOLS = [SHELL_TOOL]


async def _tool_loop(client: AsyncResponsesClient) -> str:
    """Two stored responses (a call and its answer); returns the last id."""
    first = await client.create(model="sim-model", input="fix the test", tools=TOOLS)
    outputs = [
        {"type": "function_call_output", "call_id": c["call_id"], "output": "ok"}
        for c in first.function_calls
    ]
    second = await client.create(
        model="sim-model", tools=TOOLS, previous_response_id=first.id, input=outputs
    )
    return second.id


async def test_compact_then_continue_on_a_stream_renders_incrementally(
    client: AsyncResponsesClient,
) -> None:
    async with asyncio.timeout(20):
        last = await _tool_loop(client)
        compacted = await client.compact(model="sim-model", previous_response_id=last)
        assert compacted["object"] == "response.compaction"
        assert [i["type"] for i in compacted["output"]] == ["message", "compaction"]
        assert compacted["usage"]["input_tokens"] > 0

        async with client.connect() as stream:
            start = await stream.create(
                model="sim-model",
                tools=TOOLS,
                input=[*compacted["output"], {"role": "user", "content": "go on"}],
            )
            assert start.status == "completed"
            current = start
            for turn in range(3):
                outputs = [
                    {"type": "function_call_output", "call_id": c["call_id"], "output": f"r{turn}"}
                    for c in current.function_calls
                ] or [{"role": "user", "content": f"next {turn}"}]
                # What a full render from scratch of the same conversation would count.
                full = await client.count_input_tokens(
                    model="sim-model", tools=TOOLS, previous_response_id=current.id, input=outputs
                )
                current = await stream.create(
                    model="sim-model",
                    tools=TOOLS,
                    previous_response_id=current.id,
                    input=outputs,
                )
                assert current.status == "completed"
                assert current.usage is not None
                # Rendered incrementally from the stream cache, equal to the full render.
                assert current.usage.cached_tokens > 0
                assert current.usage.input_tokens == full


async def test_compact_errors_map_to_status_codes(server: RunningServer) -> None:
    async with (
        asyncio.timeout(20),
        grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel,
    ):
        stub = pb_grpc.ResponsesServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.CompactResponse(pb.CompactResponseRequest(model=""))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        trailers = dict(caught.value.trailing_metadata() or ())
        assert trailers["error-code"] == "missing_required_parameter"
        assert trailers["error-param"] == "model"
        forged = pb.Item(compaction=pb.CompactionItem(encrypted_content="forged"))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.CompactResponse(pb.CompactResponseRequest(model="sim-model", input=[forged]))
        assert dict(caught.value.trailing_metadata() or ())["error-param"] == (
            "input[0].encrypted_content"
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetModel(pb.GetModelRequest(model="nope"))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_compact_takes_and_echoes_the_safety_identifier(server: RunningServer) -> None:
    """As ``POST /v1/responses/compact`` does in the current SDK: the request's
    ``safety_identifier`` comes back, with the ``service_tier`` that served it."""
    message = pb.Item(
        message=pb.MessageItem(
            role="user", content=[pb.ContentPart(input_text=pb.InputText(text="hi"))]
        )
    )
    async with (
        asyncio.timeout(20),
        grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel,
    ):
        stub = pb_grpc.ResponsesServiceStub(channel)
        marked = await stub.CompactResponse(
            pb.CompactResponseRequest(
                model="sim-model", input=[message], safety_identifier="user-7"
            )
        )
        plain = await stub.CompactResponse(
            pb.CompactResponseRequest(model="sim-model", input=[message])
        )
    assert marked.safety_identifier == "user-7" and marked.service_tier == "default"
    assert not plain.HasField("safety_identifier") and plain.service_tier == "default"
    assert marked.object == "response.compaction" and marked.output


async def test_count_input_tokens_and_models(client: AsyncResponsesClient) -> None:
    async with asyncio.timeout(20):
        body: dict[str, Any] = {"model": "sim-model", "input": "hello", "tools": TOOLS}
        count = await client.count_input_tokens(**body)
        created = await client.create(**body)
        assert created.usage is not None and count == created.usage.input_tokens
        models = await client.list_models()
        assert [m["id"] for m in models] == ["sim-model", "sim-other"]
        assert (await client.get_model("sim-other"))["owned_by"] == "sim"
        with pytest.raises(ResponsesError) as caught:
            await client.get_model("nope")
        assert caught.value.code == "model_not_found"
        with pytest.raises(ResponsesError) as caught:
            await client.count_input_tokens(model="nope", input="x")
        assert caught.value.code == "model_not_found"


async def test_structured_output_on_a_connect_stream(client: AsyncResponsesClient) -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 9}},
        "required": ["n"],
        "additionalProperties": False,
    }
    text = {"format": {"type": "json_schema", "name": "n", "schema": schema, "strict": True}}
    async with asyncio.timeout(20), client.connect() as stream:
        response = await stream.create(
            model="sim-model", input="a number", text=text, reasoning={"effort": "minimal"}
        )
        value = orjson.loads(response.output_text)
        assert set(value) == {"n"} and 3 <= value["n"] <= 9
        assert response.raw["text"] == text
        assert response.raw["reasoning"] == {"effort": "minimal", "summary": None}
        with pytest.raises(ResponsesError) as caught:
            await stream.create(
                model="sim-model",
                input="x",
                text={"format": {**text["format"], "schema": {"type": "object", "properties": {}}}},
            )
        assert caught.value.param == "text.format.schema.additionalProperties"


async def test_background_on_the_unary_call_survives_a_dropped_call(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server: RunningServer = await server_factory(background_config(tmp_path))
    async with (
        asyncio.timeout(30),
        AsyncResponsesClient(f"127.0.0.1:{server.grpc_port}") as client,
        grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel,
    ):
        stub = pb_grpc.ResponsesServiceStub(channel)
        params = pb.ResponseCreateParams(model="sim-model", background=True)
        params.input.append(
            pb.Item(
                message=pb.MessageItem(
                    role="user", content=[pb.ContentPart(input_text=pb.InputText(text="hi"))]
                )
            )
        )
        call = stub.CreateResponse(pb.CreateResponseRequest(params=params))
        first = await read_message(call, pb.CreateResponseResponse)
        created = first.event.response_created
        assert created.response.status == "queued" and created.response.background
        call.cancel()  # the client goes away; the response does not
        response_id = created.response.id
        events = [e async for e in client.stream_response(response_id, starting_after=0)]
        numbers = [e["sequence_number"] for e in events]
        assert numbers == list(range(1, len(numbers) + 1))
        assert events[-1]["type"] == "response.completed"
        assert (await client.get(response_id)).status == "completed"

        # Background responses are cancelled by id, like any other.
        queued = client.create_events(model="sim-other", input="again", background=True)
        head = await anext(queued)
        await queued.aclose()
        cancelled = await client.cancel(head["response"]["id"])
        assert cancelled.status == "cancelled"

        with pytest.raises(ResponsesError) as caught:
            async for _ in client.stream_response("resp_unknown"):
                pass
        assert caught.value.code == "not_found"
        async with client.connect() as stream:
            with pytest.raises(ResponsesError) as caught:
                await stream.create(model="sim-model", input="hi", background=True)
            assert caught.value.param == "background"
