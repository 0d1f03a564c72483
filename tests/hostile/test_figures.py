"""The figures users bill by: cached_tokens, partial output of cut-short responses, the ledger,
what is stored, and item statuses."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from bidi_responses.client import AsyncResponsesClient
from bidi_responses.schema import Item, JSONObject
from bidi_responses.server.app import RunningServer
from bidi_responses.server.config import Limits
from bidi_responses.server.core.api.input_items import parse_input
from bidi_responses.server.core.api.tools import parse_tools
from bidi_responses.server.core.rendering.render import common_prefix
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import SHELL_TOOL, ServerFactory, make_config
from tests.ws.conftest import connector, final

OTHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}

Turn = tuple[str | None, tuple[bool, bool], str]
turns_strategy = st.lists(
    st.tuples(
        st.sampled_from([None, "Be brief.", "You are a careful coding agent."]),
        st.tuples(st.booleans(), st.booleans()),
        st.text(alphabet="abc xyz\n", min_size=1, max_size=30),
    ),
    min_size=2,
    max_size=4,
)


def _body(turn: Turn, previous: str | None) -> dict[str, Any]:
    instructions, (shell, other), text = turn
    tools = [t for t, on in ((SHELL_TOOL, shell), (OTHER_TOOL, other)) if on]
    body: dict[str, Any] = {"model": "sim-model", "input": text, "tools": tools}
    if instructions is not None:
        body["instructions"] = instructions
    if previous is not None:
        body["previous_response_id"] = previous
    return body


def _expected_cached(server: RunningServer, turns: list[Turn], outputs: list[Any]) -> list[int]:
    """cached_tokens from full renders: the new prompt's prefix shared with the previous
    response's whole context (its prompt and its output)."""
    renderer = server.core.deps.renderer
    limits = Limits()
    items: list[Item] = []
    expected = [0]
    previous_context = None
    for index, turn in enumerate(turns):
        body = _body(turn, None)
        tools = parse_tools(body["tools"], limits)
        new_items, _ = parse_input(body["input"], limits)
        prompt = renderer.render_conversation(body.get("instructions"), tools, items + new_items)
        if previous_context is not None:
            expected.append(common_prefix(previous_context, prompt))
        # The response's output items, as the client received them.
        items += new_items + cast(list[Item], list(outputs[index]))
        previous_context = renderer.render_conversation(body.get("instructions"), tools, items)
    return expected


@pytest.fixture
async def text_server(server_factory: ServerFactory, tmp_path: Path) -> RunningServer:
    """gRPC and HTTP on a sim that answers in text at once (tools change between turns)."""
    running: RunningServer = await server_factory(make_config(tmp_path, tool_rounds=0), http=True)
    return running


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    database=None,
)
@given(turns=turns_strategy)
async def test_cached_tokens_is_the_true_shared_prefix_on_every_transport(
    text_server: RunningServer, turns: list[Turn]
) -> None:
    http_server = text_server
    assert http_server.http_port is not None
    cached: dict[str, list[int]] = {"grpc": [], "websocket": [], "http": []}
    outputs: list[Any] = []
    async with asyncio.timeout(60):
        async with (
            AsyncResponsesClient(f"127.0.0.1:{http_server.grpc_port}") as client,
            client.connect() as stream,
        ):
            previous = None
            for turn in turns:
                response = await stream.create(**_body(turn, previous), store=False)
                assert response.usage is not None
                cached["grpc"].append(response.usage.cached_tokens)
                assert response.usage.cached_tokens <= response.usage.input_tokens
                outputs.append(response.raw["output"])
                previous = response.id
        async with connector(http_server.http_port)() as sock:
            previous = None
            for turn in turns:
                response_ws = final(await sock.create(**_body(turn, previous), store=False))
                cached["websocket"].append(
                    response_ws["usage"]["input_tokens_details"]["cached_tokens"]
                )
                previous = response_ws["id"]
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{http_server.http_port}", timeout=10
        ) as http:
            previous = None
            for turn in turns:
                reply = (await http.post("/v1/responses", json=_body(turn, previous))).json()
                usage = reply["usage"]
                assert usage["input_tokens_details"]["cached_tokens"] <= usage["input_tokens"]
                cached["http"].append(usage["input_tokens_details"]["cached_tokens"])
                previous = reply["id"]
    expected = _expected_cached(http_server, turns, outputs)
    assert cached["grpc"] == expected, (turns, cached)
    assert cached["websocket"] == expected
    assert cached["http"] == expected


async def test_instructions_on_the_first_turn_only(client: AsyncResponsesClient) -> None:
    """The usual pattern that made cached_tokens exceed input_tokens."""
    long_instructions = "Follow the house style. " * 200
    async with asyncio.timeout(20), client.connect() as stream:
        first = await stream.create(
            model="sim-model", input="hi", instructions=long_instructions, store=False
        )
        second = await stream.create(
            model="sim-model", input="more", previous_response_id=first.id, store=False
        )
        assert second.usage is not None
        assert 0 <= second.usage.cached_tokens <= second.usage.input_tokens
        assert second.usage.cached_tokens < 10  # the prompts part ways at the first block


async def _slow_server(server_factory: ServerFactory, tmp_path: Path) -> RunningServer:
    config = make_config(tmp_path, tokens_per_second=400, answer_tokens=3000, tool_rounds=0)
    running: RunningServer = await server_factory(config)
    return running


async def test_cancelled_response_keeps_its_partial_output_is_stored_and_charged(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = await _slow_server(server_factory, tmp_path)
    async with (
        asyncio.timeout(30),
        AsyncResponsesClient(f"127.0.0.1:{server.grpc_port}") as client,
        client.connect() as stream,
    ):
        received = ""
        response_id = ""
        events = stream.create_events(model="sim-model", input="write a lot")
        async for event in events:
            if event["type"] == "response.created":
                response_id = event["response"]["id"]
            elif event["type"] == "response.output_text.delta":
                received += event["delta"]
                if len(received) > 60:
                    await stream.cancel(response_id)
            elif event["type"] == "response.incomplete":
                snapshot = event["response"]
                break
    assert snapshot["status"] == "cancelled"
    item = snapshot["output"][0]
    assert item["status"] == "incomplete"
    text = item["content"][0]["text"]
    assert text.startswith(received) and len(text) >= len(received) > 60
    output_tokens = snapshot["usage"]["output_tokens"]
    assert output_tokens > 0
    await server.core.deps.post.join()
    stored = cast(JSONObject, await server.core.get_response(response_id))
    assert stored["status"] == "cancelled" and stored["output"][0]["content"][0]["text"] == text
    rows = {row.response_id: row for row in await server.core.deps.store.ledger_rows()}
    assert rows[response_id].output_tokens == output_tokens
    assert rows[response_id].status == "cancelled"


async def test_abandoned_response_is_charged_what_was_generated(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = await _slow_server(server_factory, tmp_path)
    received = ""
    response_id = ""
    async with asyncio.timeout(30):
        async with AsyncResponsesClient(f"127.0.0.1:{server.grpc_port}") as client:
            stream_cm = client.connect()
            stream = await stream_cm.__aenter__()
            async for event in stream.create_events(model="sim-model", input="write a lot"):
                if event["type"] == "response.created":
                    response_id = event["response"]["id"]
                elif event["type"] == "response.output_text.delta":
                    received += event["delta"]
                    if len(received) > 60:
                        break
        # The channel closed under the stream: the client is gone.
        await server.core.wait_until_idle()
        await server.core.deps.post.join()
    rows = {row.response_id: row for row in await server.core.deps.store.ledger_rows()}
    assert rows[response_id].status == "cancelled"
    assert rows[response_id].output_tokens > 0
    stored = cast(JSONObject, await server.core.get_response(response_id))
    text = stored["output"][0]["content"][0]["text"]
    assert text.startswith(received)
    assert stored["usage"]["output_tokens"] == rows[response_id].output_tokens


async def test_max_output_tokens_marks_the_message_incomplete(client: AsyncResponsesClient) -> None:
    async with asyncio.timeout(20), client.connect() as stream:
        response = await stream.create(
            model="sim-model", input="hi", max_output_tokens=16, store=False
        )
    # The fast sim answers ~30 tokens after 3 tool rounds; with tools absent it answers at once.
    assert response.status == "incomplete"
    assert response.raw["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response.output[-1].get("status") == "incomplete"
    assert response.usage is not None and response.usage.output_tokens <= 16


async def test_an_idle_server_trims_its_heap(server_factory: ServerFactory, tmp_path: Path) -> None:
    config = make_config(tmp_path)
    config.trim_memory_idle_s = 0.01
    server: RunningServer = await server_factory(config)
    async with asyncio.timeout(20):
        async with (
            AsyncResponsesClient(f"127.0.0.1:{server.grpc_port}") as client,
            client.connect() as stream,
        ):
            await stream.create(model="sim-model", input="hi", store=False)
            assert server.core.parts.trimmer.trims == 0  # never while a stream is open
        await server.core.parts.trimmer.trimmed.wait()
    assert server.core.parts.trimmer.trims == 1
