"""HTTP+SSE and WebSocket mode through Envoy's HTTP listener, with the official openai SDK,
over two replicas on one PostgreSQL: a stored response created through one request is
continued by the next, wherever Envoy sends it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest
from bidi_responses.cluster.postgres import PostgresUnavailable, find_bin_dir
from bidi_responses.cluster.replicas import Cluster

pytestmark = pytest.mark.timeout(90)

TOOL = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    "strict": False,
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    try:
        find_bin_dir()
    except PostgresUnavailable as error:
        pytest.skip(f"replicas not tested: {error}")
    with Cluster(2, serve_args=["--sim-tool-rounds", "100", "--log-level", "WARNING"]) as c:
        yield c


async def test_sse_and_websocket_through_envoy(cluster: Cluster) -> None:
    sdk = openai.AsyncOpenAI(
        base_url=cluster.http_base_url, api_key="test", max_retries=0, timeout=20
    )
    try:
        async with asyncio.timeout(60):
            # HTTP+SSE: each request may land on either replica; the chain is in PostgreSQL.
            first = await sdk.responses.create(model="sim-model", input="go", tools=[TOOL])
            previous = first
            for _ in range(4):
                call = next(i for i in previous.output if i.type == "function_call")
                stream = await sdk.responses.create(
                    model="sim-model",
                    previous_response_id=previous.id,
                    tools=[TOOL],
                    input=[
                        {"type": "function_call_output", "call_id": call.call_id, "output": "ok"}
                    ],
                    stream=True,
                )
                events = [event async for event in stream]
                assert events[0].type == "response.created"
                assert events[-1].type == "response.completed"
                previous = events[-1].response
                assert previous.previous_response_id is not None
            fetched = await sdk.responses.retrieve(previous.id)
            assert fetched.status == "completed"
            # WebSocket mode through Envoy's upgrade route.
            async with sdk.responses.connect() as conn:
                await conn.response.create(
                    model="sim-model", input="hi", previous_response_id=first.id, tools=[TOOL]
                )
                types = []
                async for event in conn:
                    types.append(event.type)
                    if event.type in ("response.completed", "error"):
                        break
                assert types[-1] == "response.completed", types
    finally:
        await sdk.close()
