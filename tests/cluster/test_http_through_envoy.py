"""HTTP+SSE and WebSocket mode through Envoy's HTTP listener, with the official openai SDK,
over two replicas on one PostgreSQL: a stored response created through one request is
continued by the next, wherever Envoy sends it. Every port is the one asked for."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import urllib.request
from collections.abc import Iterator

import openai
import pytest
from bidi_responses.bench.ports import free_port
from bidi_responses.cluster.postgres import PostgresUnavailable, find_bin_dir
from bidi_responses.cluster.replicas import Cluster
from openai.types.responses import FunctionToolParam

pytestmark = pytest.mark.timeout(90)

TOOL: FunctionToolParam = {
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
    ASKED.update(
        grpc_port=free_port(),
        http_port=free_port(),
        admin_port=free_port(),
        replica_ports=_free_run(4),
    )
    with Cluster(
        2,
        serve_args=["--sim-tool-rounds", "100", "--log-level", "WARNING"],
        grpc_port=ASKED["grpc_port"],
        http_port=ASKED["http_port"],
        admin_port=ASKED["admin_port"],
        replica_ports=ASKED["replica_ports"],
    ) as c:
        yield c


# The ports the cluster was asked to use.
ASKED: dict[str, int] = {}


def _free_run(count: int) -> int:
    """The first of ``count`` consecutive loopback ports that were free a moment ago."""
    for _ in range(100):
        first = random.randrange(20_000, 30_000)
        with contextlib.ExitStack() as held:
            try:
                for port in range(first, first + count):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return first
    raise RuntimeError(f"no {count} consecutive free ports")


def test_the_cluster_listens_where_asked(cluster: Cluster) -> None:
    first = ASKED["replica_ports"]
    assert [(r.grpc_port, r.http_port) for r in cluster.replicas] == [
        (first, first + 1),
        (first + 2, first + 3),
    ]
    assert cluster.grpc_target == f"127.0.0.1:{ASKED['grpc_port']}"
    assert cluster.http_base_url == f"http://127.0.0.1:{ASKED['http_port']}/v1"
    # Envoy's admin listener is on the port given (it says it is ready there); the test above
    # reaches the replicas through Envoy's HTTP port.
    admin = f"http://127.0.0.1:{ASKED['admin_port']}/ready"
    with urllib.request.urlopen(admin, timeout=5) as response:
        assert response.read().strip() == b"LIVE"


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
                last = events[-1]
                assert last.type == "response.completed"
                previous = last.response
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
