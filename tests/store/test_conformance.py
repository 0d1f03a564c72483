"""The store contract, proved on both backends: what SQLite promises, PostgreSQL keeps.

When a store change lands in one backend (a column, a scope, a rule), a test here states it
and fails on the other backend until that one is ported.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import cast

import asyncpg
import pytest
from bidi_responses.cluster.postgres import TempPostgres
from bidi_responses.schema import Item, JSONObject, ResponseObject
from bidi_responses.server.core.storage.backend import ResponseStore, open_store
from bidi_responses.server.core.storage.pg_store import MIGRATIONS, PostgresStore
from bidi_responses.server.core.storage.sqlite_store import Store
from bidi_responses.server.core.storage.store import LedgerRow, StoredResponse

from tests.store.conftest import fresh_database

pytestmark = pytest.mark.timeout(60)


def response(rid: str, previous: str | None = None, created_at: int = 1) -> ResponseObject:
    """The fields of a Response that the stores read (the rest they keep as given)."""
    return cast(
        ResponseObject,
        {
            "id": rid,
            "object": "response",
            "created_at": created_at,
            "status": "completed",
            "previous_response_id": previous,
            "instructions": "be brief",
            "output": [{"type": "message", "id": f"msg_{rid}", "role": "assistant", "content": []}],
        },
    )


def record(rid: str, previous: str | None = None, n_items: int = 1) -> StoredResponse:
    items: list[Item] = [
        {"type": "message", "id": f"in_{rid}_{i}", "role": "user", "content": []}
        for i in range(n_items)
    ]
    return StoredResponse(response(rid, previous), items, previous, previous is None)


def ledger(rid: str, status: str = "completed", created_at: int = 1) -> LedgerRow:
    return LedgerRow(rid, "tenant-a", "sim-model", status, 10, 2, 5, 1.5, 0.2, 0.1, "grpc",
                     created_at, created_at + 1)  # fmt: skip


async def test_write_then_get_round_trips(store: ResponseStore) -> None:
    rec = record("resp_1", n_items=3)
    await store.write(rec, ledger("resp_1"))
    got = await store.get("resp_1")
    assert got is not None
    assert got.response == rec.response
    assert got.input_items == rec.input_items
    assert got.previous_response_id is None and got.self_contained
    assert await store.get("resp_missing") is None


async def test_staged_record_is_readable_before_its_write(store: ResponseStore) -> None:
    rec = record("resp_s")
    store.stage("resp_s", rec)
    assert await store.get("resp_s") is rec
    store.unstage("resp_s", rec)
    assert await store.get("resp_s") is None


async def test_write_is_idempotent_and_the_first_ledger_row_wins(store: ResponseStore) -> None:
    await store.write(record("resp_1"), ledger("resp_1", "completed"))
    await store.write(record("resp_1"), ledger("resp_1", "cancelled"))
    await store.write(None, ledger("resp_1", "failed"))
    rows = await store.ledger_rows()
    assert [(r.response_id, r.status) for r in rows] == [("resp_1", "completed")]


async def test_a_finished_attempt_replaces_a_cancelled_ledger_row(store: ResponseStore) -> None:
    """A turn retried with its idempotency key after its first attempt was cut short: the
    response id has one row, and it is the finished attempt's."""
    await store.write(None, ledger("resp_k", "cancelled"))
    await store.write(record("resp_k"), ledger("resp_k", "completed", created_at=7))
    await store.write(None, ledger("resp_k", "cancelled"))
    await store.write(None, ledger("resp_k", "failed"))
    rows = await store.ledger_rows()
    assert [(r.response_id, r.status, r.created_at) for r in rows] == [("resp_k", "completed", 7)]


async def test_ledger_rows_keep_their_fields_and_order(store: ResponseStore) -> None:
    for i, created in enumerate((5, 3, 3, 9)):
        await store.write(None, ledger(f"resp_{i}", created_at=created))
    rows = await store.ledger_rows()
    assert [r.response_id for r in rows] == ["resp_1", "resp_2", "resp_0", "resp_3"]
    assert rows[0] == ledger("resp_1", created_at=3)


async def test_chain_walks_back_to_the_self_contained_record(store: ResponseStore) -> None:
    await store.write(record("resp_a"), None)
    await store.write(record("resp_b", "resp_a"), None)
    store.stage("resp_c", record("resp_c", "resp_b"))  # the last link still queued
    chain = await store.chain("resp_c")
    assert chain is not None
    assert [link.response["id"] for link in chain] == ["resp_a", "resp_b", "resp_c"]
    assert await store.delete("resp_a")
    assert await store.get("resp_a") is None
    # A deleted ancestor still lends its items: continuing from resp_c keeps working.
    chain = await store.chain("resp_c")
    assert chain is not None
    assert [link.response["id"] for link in chain] == ["resp_a", "resp_b", "resp_c"]
    assert await store.chain("resp_a") is None  # but not when it is asked for itself
    assert not await store.delete("resp_a")


async def test_delete(store: ResponseStore) -> None:
    await store.write(record("resp_d"), ledger("resp_d"))
    assert await store.delete("resp_d")
    assert await store.get("resp_d") is None
    assert not await store.delete("resp_d")
    # Deleting a response keeps its ledger row: usage stays accounted.
    assert [r.response_id for r in await store.ledger_rows()] == ["resp_d"]


async def test_delete_while_the_write_is_queued(store: ResponseStore) -> None:
    rec = record("resp_q")
    store.stage("resp_q", rec)
    assert await store.delete("resp_q")
    assert await store.get("resp_q") is None
    await store.write(rec, ledger("resp_q"))  # the queued write lands, then is deleted
    assert await store.get("resp_q") is None
    assert not await store.delete("resp_q")


async def test_a_replayed_write_does_not_bring_a_deleted_response_back(
    store: ResponseStore,
) -> None:
    """A journal replay after a crash writes landed records again; a delete must hold."""
    rec = record("resp_r")
    await store.write(rec, ledger("resp_r"))
    assert await store.delete("resp_r")
    await store.write(rec, ledger("resp_r"))  # the replay
    assert await store.get("resp_r") is None
    assert await store.get("resp_r", include_deleted=True) is None
    assert not await store.delete("resp_r")
    assert [r.response_id for r in await store.ledger_rows()] == ["resp_r"]


async def test_tenants_see_only_their_own_records(store: ResponseStore) -> None:
    """Another tenant's record reads, chains and deletes exactly like a missing one."""
    owned = record("resp_t1")
    owned.tenant = "tenant-a"
    await store.write(owned, None)
    follow = record("resp_t2", "resp_t1")
    follow.tenant = "tenant-a"
    store.stage("resp_t2", follow)  # staged records are scoped too
    for rid in ("resp_t1", "resp_t2"):
        got = await store.get(rid, "tenant-a")
        assert got is not None and got.tenant == "tenant-a"
        assert await store.get(rid, "tenant-b") is None
        assert await store.get(rid) is None  # an open-server caller is no tenant
    chain = await store.chain("resp_t2", "tenant-a")
    assert chain is not None and len(chain) == 2
    assert await store.chain("resp_t2", "tenant-b") is None
    assert not await store.delete("resp_t1", "tenant-b")
    assert await store.get("resp_t1", "tenant-a") is not None
    assert await store.delete("resp_t1", "tenant-a")
    assert await store.get("resp_t1", "tenant-a") is None


async def test_large_input_round_trips(store: ResponseStore) -> None:
    text = "x" * 2_000_000
    rec = StoredResponse(
        response("resp_big"),
        [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}],
        None,
        True,
    )
    await store.write(rec, None)
    got = await store.get("resp_big")
    assert got is not None and cast(JSONObject, got.input_items[0])["content"][0]["text"] == text


def test_open_store_rejects_an_unknown_url(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"store\.url: unsupported URL 'mysql://\.\.\.'"):
        open_store("mysql://x/y", tmp_path / "r.db")


async def test_schemas_have_the_same_columns(postgres_server: TempPostgres, tmp_path: Path) -> None:
    """Parity guard: a column added to one backend's schema must be added to the other."""
    sqlite_store = Store(tmp_path / "r.db")
    sqlite_store.close()
    conn = sqlite3.connect(tmp_path / "r.db")
    sqlite_columns = {
        table: [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
        for table in ("responses", "usage_ledger")
    }
    conn.close()
    url = await fresh_database(postgres_server)
    pg = PostgresStore(url)
    await pg.open()
    await pg.aclose()
    pg_conn = await asyncpg.connect(url)
    try:
        pg_columns = {
            table: [
                row[0]
                for row in await pg_conn.fetch(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_name = $1 ORDER BY ordinal_position",
                    table,
                )
            ]
            for table in ("responses", "usage_ledger")
        }
    finally:
        await pg_conn.close()
    pg_columns["usage_ledger"].remove("seq")  # SQLite's rowid
    assert pg_columns == sqlite_columns


async def test_replicas_starting_together_migrate_once(postgres_server: TempPostgres) -> None:
    url = await fresh_database(postgres_server)
    stores = [PostgresStore(url) for _ in range(3)]
    await asyncio.gather(*(s.open() for s in stores))
    await asyncio.gather(*(s.aclose() for s in stores))
    conn = await asyncpg.connect(url)
    try:
        versions = [r[0] for r in await conn.fetch("SELECT version FROM schema_migrations")]
    finally:
        await conn.close()
    assert versions == [m.version for m in MIGRATIONS]
