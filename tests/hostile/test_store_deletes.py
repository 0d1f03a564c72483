"""Deleting stored responses never breaks continuing from a later one."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import httpx
from bidi_responses.server.app import RunningServer
from bidi_responses.server.core.storage.sqlite_store import Store

from tests.http.conftest import http as http  # the fixture


async def _create(http: httpx.AsyncClient, text: str, previous: str | None, **extra: Any) -> Any:
    body: dict[str, Any] = {"model": "sim-model", "input": text, **extra}
    if previous is not None:
        body["previous_response_id"] = previous
    reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _rows(server: RunningServer) -> set[str]:
    store = server.core.deps.store
    assert isinstance(store, Store)  # the default backend
    with sqlite3.connect(store.path) as conn:
        return {row[0] for row in conn.execute("SELECT id FROM responses")}


async def test_continuing_from_r3_after_deleting_r1_and_r2(
    http_server: RunningServer,
    http: httpx.AsyncClient,
) -> None:
    async with asyncio.timeout(30):
        r1 = await _create(http, "one", None)
        r2 = await _create(http, "two", r1["id"])
        r3 = await _create(http, "three", r2["id"])
        before = await _create(http, "four", r3["id"], store=False)
        for response in (r1, r2):
            deleted = await http.delete(f"/v1/responses/{response['id']}")
            assert deleted.json() == {
                "id": response["id"],
                "object": "response.deleted",
                "deleted": True,
            }
        # Hosted semantics for the deleted ones.
        for response in (r1, r2):
            gone = await http.get(f"/v1/responses/{response['id']}")
            assert gone.status_code == 404
            assert (await http.delete(f"/v1/responses/{response['id']}")).status_code == 404
            items = await http.get(f"/v1/responses/{response['id']}/input_items")
            assert items.status_code == 404
        refused = await http.post(
            "/v1/responses",
            json={"model": "sim-model", "input": "x", "previous_response_id": r2["id"]},
        )
        assert refused.json()["error"]["code"] == "previous_response_not_found"
        # The later response still carries its whole history.
        assert (await http.get(f"/v1/responses/{r3['id']}")).status_code == 200
        after = await _create(http, "four", r3["id"], store=False)
        assert after["usage"]["input_tokens"] == before["usage"]["input_tokens"]
        assert after["output"] == [
            {**item, "id": after_item["id"]}
            for item, after_item in zip(before["output"], after["output"], strict=True)
        ]
        await http_server.core.deps.post.join()
        assert {r1["id"], r2["id"]} <= _rows(http_server)  # kept, hidden, while r3 needs them
        # Deleting the last response that needs them removes the rows for good.
        assert (await http.delete(f"/v1/responses/{r3['id']}")).status_code == 200
        assert not {r1["id"], r2["id"], r3["id"]} & _rows(http_server)
