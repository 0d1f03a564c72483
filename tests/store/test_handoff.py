"""Stream handoff: a draining replica leaves its streams' states in PostgreSQL, and the replica
that gets the next turn continues as a cached turn, rendering only the new input."""

from __future__ import annotations

import asyncio
from array import array
from pathlib import Path
from typing import Any, cast

import pytest
from bidi_responses.client import AsyncResponsesClient, ConnectStream, Response
from bidi_responses.cluster.postgres import TempPostgres
from bidi_responses.schema import ResponseObject
from bidi_responses.server.app import RunningServer
from bidi_responses.server.core.conversation.state import ConversationState
from bidi_responses.server.core.storage.handoff import decode_state, encode_state

from tests.conftest import SHELL_TOOL, ServerFactory, make_config
from tests.store.conftest import fresh_database

pytestmark = pytest.mark.timeout(60)


def test_state_encoding_round_trips() -> None:
    state = ConversationState(
        tokens=array("I", [1, 2, 3, 2**32 - 1]),
        prefix_len=2,
        prefix_key=("be brief", [{"type": "function", "name": "f"}], {"$s": "a dict"}),
        items=[{"type": "message", "id": "m1", "role": "user", "content": []}],
        call_names={"call_1": "f"},
        answered_calls={"call_0"},
        model_turns=3,
        tool_rounds=2,
        stored_chain=True,
        last_response=cast(ResponseObject, {"id": "resp_1"}),  # only its identity matters here
        stage_state={"secrets": {"seen": {b"\x00\xff": None}, "found": 1}, "x": {"t": (1, 2)}},
        item_bytes=42,
        format_name="harmony",
    )
    assert decode_state(encode_state(state)) == state
    with pytest.raises(ValueError, match="unknown state version"):
        blob = encode_state(state).replace(b'"v":1', b'"v":9', 1)
        decode_state(blob)


async def test_deleting_a_response_drops_its_handed_off_state(
    postgres_server: TempPostgres,
) -> None:
    from bidi_responses.server.core.storage.pg_store import PostgresStore
    from bidi_responses.server.core.storage.store import StoredResponse

    store = PostgresStore(await fresh_database(postgres_server))
    await store.open()
    try:
        record = StoredResponse(
            cast(ResponseObject, {"id": "resp_x", "created_at": 1}), [], None, True
        )
        await store.write(record, None)
        await store.save_states([("resp_x", b"state")], ttl_s=60)
        assert await store.delete("resp_x")
        assert await store.take_state("resp_x") is None
    finally:
        await store.aclose()


def _next_turn(response: Response, chars: int = 4000) -> dict[str, Any]:
    """The parameters of the turn after ``response``: its call's output, ``chars`` long."""
    return {
        "model": "sim-model",
        "previous_response_id": response.id,
        "input": [response.call_output("y" * chars)],
        "tools": [SHELL_TOOL],
    }


async def _replicas(
    factory: ServerFactory, tmp_path: Path, pg: TempPostgres, **sim: Any
) -> tuple[RunningServer, RunningServer]:
    url = await fresh_database(pg)
    servers = []
    for name in ("a", "b"):
        config = make_config(tmp_path / name, tool_rounds=100, **sim)
        config.store.url = url
        servers.append(await factory(config))
    return servers[0], servers[1]


async def _history(stream: ConnectStream, turns: int) -> Response:
    response = await stream.create(model="sim-model", input="go", tools=[SHELL_TOOL])
    for _ in range(turns):
        response = await stream.create(**_next_turn(response))
    return response


async def test_a_drained_stream_continues_cached_on_another_replica(
    postgres_server: TempPostgres, server_factory: ServerFactory, tmp_path: Path
) -> None:
    async with asyncio.timeout(40):
        a, b = await _replicas(server_factory, tmp_path, postgres_server)
        async with AsyncResponsesClient(f"127.0.0.1:{a.grpc_port}") as on_a:
            stream = on_a.open_stream()
            last = await _history(stream, 6)
            await a.stop(grace=5)  # drain: the idle lane's state goes to PostgreSQL
            assert any(w.get("code") == "server_draining" for w in stream.warnings)
            await stream.close()
        async with (
            AsyncResponsesClient(f"127.0.0.1:{b.grpc_port}") as on_b,
            on_b.connect() as stream,
        ):
            resumed = await stream.create(**_next_turn(last))
            # A second continuation of the same id finds no state (it was taken): the store's
            # chain is re-rendered, which is what every resumed turn costs without handoff.
            rebuilt = await stream.create(**_next_turn(last))
        assert resumed.stats["tokens_reused"] > 6 * 500
        assert resumed.stats["items_validated"] == 1
        assert a.core.deps.state.failover["states_handed_off"] == 1
        assert b.core.stats()["failover"]["states_restored"] == 1
        assert rebuilt.stats["tokens_reused"] == 0
        assert rebuilt.stats["items_validated"] > 10
        assert rebuilt.stats["tokens_rendered"] > 5 * resumed.stats["tokens_rendered"]
        # Same conversation either way: the engine saw the same prompt length.
        assert resumed.usage is not None and rebuilt.usage is not None
        assert resumed.usage.input_tokens == rebuilt.usage.input_tokens


async def test_a_response_in_flight_at_the_drain_hands_off_its_state(
    postgres_server: TempPostgres, server_factory: ServerFactory, tmp_path: Path
) -> None:
    async with asyncio.timeout(40):
        a, b = await _replicas(server_factory, tmp_path, postgres_server, ttft_ms=300)
        async with AsyncResponsesClient(f"127.0.0.1:{a.grpc_port}") as on_a:
            stream = on_a.open_stream()
            first = await _history(stream, 2)
            events = stream.create_events(**_next_turn(first))
            created = await anext(events)
            assert created["type"] == "response.created"
            stopping = asyncio.ensure_future(a.stop(grace=5))
            terminal = [e async for e in events][-1]
            assert terminal["type"] == "response.completed"
            await stopping
            await stream.close()
        async with (
            AsyncResponsesClient(f"127.0.0.1:{b.grpc_port}") as on_b,
            on_b.connect() as stream,
        ):
            last = Response.from_dict(terminal["response"])
            resumed = await stream.create(**_next_turn(last))
        assert resumed.stats["tokens_reused"] > 2 * 500
        assert resumed.stats["items_validated"] == 1
