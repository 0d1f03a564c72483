"""Unary calls: get, delete, list input items (paging), cancel, stats."""

from __future__ import annotations

import asyncio

import pytest
from bidi_responses.client import AsyncResponsesClient, Item, ResponsesError
from bidi_responses.server.app import RunningServer
from bidi_responses.server.core.tenancy.tenants import tenant_from_authorization


def _text(item: Item) -> str:
    """The text of a one-part user message."""
    assert item["type"] == "message"
    part = item["content"][0]
    assert part["type"] == "input_text"
    return part["text"]


async def test_get_list_delete_a_stored_response(client: AsyncResponsesClient) -> None:
    async with asyncio.timeout(20):
        items = [{"type": "message", "role": "user", "content": f"message {i}"} for i in range(7)]
        created = await client.create(model="sim-model", input=items)
        stored = await client.get(created.id)
        assert stored.id == created.id and stored.output_text == created.output_text

        seen: list[str] = []
        after = ""
        while True:
            page = await client.list_input_items(created.id, limit=3, order="asc", after=after)
            seen += [_text(item) for item in page["data"]]
            assert page["first_id"] == page["data"][0]["id"]
            if not page["has_more"]:
                break
            assert page["last_id"] is not None
            after = page["last_id"]
        assert seen == [f"message {i}" for i in range(7)]
        newest = await client.list_input_items(created.id, limit=1)
        assert _text(newest["data"][0]) == "message 6"

        assert await client.delete(created.id) is True
        with pytest.raises(ResponsesError) as caught:
            await client.get(created.id)
        assert caught.value.code == "not_found"
        with pytest.raises(ResponsesError):
            await client.delete(created.id)


async def test_store_false_is_not_retrievable(client: AsyncResponsesClient) -> None:
    async with asyncio.timeout(20):
        created = await client.create(model="sim-model", input="secret", store=False)
        with pytest.raises(ResponsesError):
            await client.get(created.id)


async def test_stats_count_work(client: AsyncResponsesClient) -> None:
    async with asyncio.timeout(20):
        before = await client.stats()
        response = await client.create(model="sim-model", input="count me")
        after = await client.stats()
        assert after["responses_total"] == before["responses_total"] + 1
        assert (
            after["tokens_rendered_total"] - before["tokens_rendered_total"]
            == (response.stats["tokens_rendered"])
        )
        assert after["items_validated_total"] == before["items_validated_total"] + 1
        assert after["engine_ms_total"] > before["engine_ms_total"] or (
            response.stats["engine_ms"] == 0
        )
        assert after["process_cpu_seconds"] > 0
        assert "validation" in after["stage_items_total"]


async def test_list_input_items_bad_cursor(client: AsyncResponsesClient) -> None:
    async with asyncio.timeout(20):
        created = await client.create(model="sim-model", input="x")
        with pytest.raises(ResponsesError) as caught:
            await client.list_input_items(created.id, after="msg_nope")
        assert caught.value.param == "after"
        with pytest.raises(ResponsesError) as bad_limit:
            await client.list_input_items(created.id, limit=500)
        assert bad_limit.value.param == "limit"


async def test_usage_is_accounted_to_the_api_key_tenant(server: RunningServer) -> None:
    async with (
        asyncio.timeout(20),
        AsyncResponsesClient(f"127.0.0.1:{server.grpc_port}", api_key="sk-team-a") as client,
    ):
        async with client.connect() as stream:
            streamed = await stream.create(model="sim-model", input="hi")
        stateless = await client.create(model="sim-model", input="hi")
        explicit = await client.create(model="sim-model", input="hi", user="billing-42")
        await server.core.deps.post.join()
        rows = {row.response_id: row for row in await server.core.deps.store.ledger_rows()}
        expected = tenant_from_authorization("Bearer sk-team-a")
        assert rows[streamed.id].tenant == expected
        assert rows[stateless.id].tenant == expected
        assert rows[explicit.id].tenant == "billing-42"
        assert rows[streamed.id].transport == "grpc"
        # The caller is an argument, never written into the body: the stored response keeps
        # ``user`` only when the client sent it, on Connect and CreateResponse alike.
        for labelled in (streamed, stateless):
            assert (await server.core.get_response(labelled.id))["user"] is None
        assert (await server.core.get_response(explicit.id))["user"] == "billing-42"
        stats = await client.stats()
        assert stats["post_queue"]["written"] >= 3


async def test_writes_after_the_stream_ended_raise_a_clear_error(
    client: AsyncResponsesClient,
) -> None:
    async with asyncio.timeout(20), client.connect() as stream:
        await stream.create(model="sim-model", input="hi")
        await stream.close()
        with pytest.raises(ResponsesError) as caught:
            await stream.create(model="sim-model", input="again")
        assert caught.value.code == "stream_closed"
