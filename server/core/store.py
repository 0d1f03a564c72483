"""Durable store of responses and the usage ledger, in embedded SQLite.

All database work runs on one dedicated thread, so the event loop never blocks on disk and
SQLite sees a single writer. Writes are queued by the post-inference stage; until a write
lands, readers see the record through an in-memory map, so a client that continues right
after ``response.completed`` finds its response even though the disk write is still queued.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar

import orjson
from bidi_responses.server.core.event_types import ResponseObject
from bidi_responses.server.core.items import Item

T = TypeVar("T")

_BUSY_TIMEOUT_S = 10.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    previous_response_id TEXT,
    created_at INTEGER NOT NULL,
    response_json BLOB NOT NULL,
    input_json BLOB NOT NULL,
    -- 1 when input_json holds the whole conversation before this response (its predecessor
    -- was not stored), 0 when it holds only the new input after previous_response_id.
    self_contained INTEGER NOT NULL,
    instructions TEXT,
    -- The authenticated owner; NULL on an open server. Reads pass the caller's tenant and see
    -- only rows with that exact owner.
    tenant TEXT
);
CREATE TABLE IF NOT EXISTS usage_ledger (
    response_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    model TEXT NOT NULL,
    status TEXT NOT NULL,
    input_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    engine_ms REAL NOT NULL,
    api_pre_ms REAL NOT NULL,
    api_post_ms REAL NOT NULL,
    transport TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    completed_at INTEGER
);
"""


# A deleted response disappears for clients at once (GET, input items and continuing from it
# give not found, as in the hosted API) but its row stays, hidden, while a later stored
# response still resolves its history through it; the last such response's deletion removes
# the rows for good. The tombstone itself is kept, so that replaying the journal after a crash
# cannot bring a deleted response back.
_TOMBSTONES = """
CREATE TABLE IF NOT EXISTS deleted_responses (
    id TEXT PRIMARY KEY,
    deleted_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_previous ON responses (previous_response_id);
"""

# The ledger's conflict rule (the same in pg_store.py).
LEDGER_CONFLICT_RULE = (
    "ON CONFLICT (response_id) DO UPDATE SET tenant = excluded.tenant, model = excluded.model, "
    "status = excluded.status, input_tokens = excluded.input_tokens, "
    "cached_tokens = excluded.cached_tokens, output_tokens = excluded.output_tokens, "
    "engine_ms = excluded.engine_ms, api_pre_ms = excluded.api_pre_ms, "
    "api_post_ms = excluded.api_post_ms, transport = excluded.transport, "
    "created_at = excluded.created_at, completed_at = excluded.completed_at "
    "WHERE usage_ledger.status = 'cancelled' AND excluded.status <> 'cancelled'"
)


@dataclass(slots=True)
class StoredResponse:
    """One stored response: the Response object and the input items it was given."""

    response: ResponseObject
    input_items: list[Item]
    previous_response_id: str | None
    self_contained: bool
    # The owner (None on an open server): another tenant reads it as not found.
    tenant: str | None = None

    def visible_to(self, tenant: str | None) -> bool:
        """True if ``tenant`` owns this response."""
        return self.tenant == tenant


@dataclass(slots=True)
class LedgerRow:
    """One usage row: exactly one per finished response."""

    response_id: str
    tenant: str
    model: str
    status: str
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    engine_ms: float
    api_pre_ms: float
    api_post_ms: float
    transport: str
    created_at: int
    completed_at: int | None


class Store:
    """SQLite-backed response store and usage ledger (a ``ResponseStore``)."""

    # One process owns the file: a turn may be acknowledged before its write lands.
    shared = False

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        self._local = threading.local()
        self._pending: dict[str, StoredResponse] = {}
        self._deleted_pending: set[str] = set()
        self._run_sync(self._init)

    # -- thread plumbing -------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            # Worker processes share the file: WAL lets readers run beside the one writer,
            # and a writer waits for another process's write instead of failing. FULL (below):
            # a commit is on disk when it returns, so the journal segment that held the job
            # can be deleted.
            conn = sqlite3.connect(self._path, timeout=_BUSY_TIMEOUT_S)
            conn.execute(f"PRAGMA busy_timeout={int(_BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            self._local.conn = conn
        return conn

    def _init(self) -> None:
        conn = self._conn()
        conn.executescript(_SCHEMA)
        columns = {row[1] for row in conn.execute("PRAGMA table_info(responses)")}
        if "tenant" not in columns:  # a database from before tenants
            with conn:
                conn.execute("ALTER TABLE responses ADD COLUMN tenant TEXT")
        conn.executescript(_TOMBSTONES)

    def _run_sync(self, fn: Callable[[], T]) -> T:
        return self._executor.submit(fn).result()

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    # -- writes (post-inference) -----------------------------------------------------------

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    def stage(self, response_id: str, record: StoredResponse) -> None:
        """Make a response readable now; ``write`` makes it durable later."""
        self._pending[response_id] = record

    def unstage(self, response_id: str, record: StoredResponse) -> None:
        """Withdraw a staged record whose write will not happen (its job was never queued)."""
        if self._pending.get(response_id) is record:
            del self._pending[response_id]

    async def write(self, record: StoredResponse | None, ledger: LedgerRow | None) -> None:
        """Write a response and/or its ledger row in one transaction (idempotent by id)."""
        await self.write_many([(record, ledger)])

    async def write_many(self, jobs: list[tuple[StoredResponse | None, LedgerRow | None]]) -> None:
        """Write several responses and ledger rows in one durable transaction.

        Idempotent by response id: a row already there is kept, and a deleted response stays
        deleted (journal replay may repeat a write that already landed): its row is written
        hidden and purged at once unless a later response's history still needs it.
        """
        needed = self._needed_by_pending()
        await self._run(partial(self._write_many, jobs, needed))
        for record, _ in jobs:
            if record is None:
                continue
            response_id = record.response["id"]
            if self._pending.get(response_id) is record:
                del self._pending[response_id]
            self._deleted_pending.discard(response_id)

    def _needed_by_pending(self) -> set[str | None]:
        """Responses whose rows queued continuations will need once they are written."""
        return {r.previous_response_id for r in self._pending.values() if not r.self_contained}

    def _write_many(
        self,
        jobs: list[tuple[StoredResponse | None, LedgerRow | None]],
        needed: set[str | None],
    ) -> None:
        conn = self._conn()
        with conn:
            for record, ledger in jobs:
                if record is not None:
                    resp = record.response
                    conn.execute(
                        "INSERT OR IGNORE INTO responses (id, previous_response_id, created_at, "
                        "response_json, input_json, self_contained, instructions, tenant) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            resp["id"],
                            record.previous_response_id,
                            resp["created_at"],
                            orjson.dumps(resp),
                            orjson.dumps(record.input_items),
                            int(record.self_contained),
                            resp.get("instructions"),
                            record.tenant,
                        ),
                    )
                    _purge(conn, resp["id"], needed)
                if ledger is not None:
                    # One row per response: the first wins, except that a finished attempt
                    # replaces the "cancelled" row of an attempt cut short (a retried turn
                    # with the same idempotency key).
                    conn.execute(
                        "INSERT INTO usage_ledger VALUES "
                        "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) " + LEDGER_CONFLICT_RULE,
                        (
                            ledger.response_id,
                            ledger.tenant,
                            ledger.model,
                            ledger.status,
                            ledger.input_tokens,
                            ledger.cached_tokens,
                            ledger.output_tokens,
                            ledger.engine_ms,
                            ledger.api_pre_ms,
                            ledger.api_post_ms,
                            ledger.transport,
                            ledger.created_at,
                            ledger.completed_at,
                        ),
                    )

    # -- reads -----------------------------------------------------------------------------

    async def get(
        self, response_id: str, tenant: str | None = None, *, include_deleted: bool = False
    ) -> StoredResponse | None:
        """A stored response owned by ``tenant``, or None (absent or another tenant's).
        ``include_deleted`` also finds a deleted response whose row a later response's
        history still needs (for ``chain``)."""
        record = await self._get(response_id, include_deleted)
        return record if record is not None and record.visible_to(tenant) else None

    async def _get(self, response_id: str, include_deleted: bool = False) -> StoredResponse | None:
        if response_id in self._deleted_pending and not include_deleted:
            return None
        pending = self._pending.get(response_id)
        if pending is not None:
            return pending
        hidden = "" if include_deleted else " AND id NOT IN (SELECT id FROM deleted_responses)"

        def work() -> StoredResponse | None:
            row = (
                self._conn()
                .execute(
                    "SELECT response_json, input_json, previous_response_id, self_contained, "
                    "tenant FROM responses WHERE id = ?" + hidden,
                    (response_id,),
                )
                .fetchone()
            )
            if row is None:
                return None
            return StoredResponse(
                orjson.loads(row[0]), orjson.loads(row[1]), row[2], bool(row[3]), row[4]
            )

        return await self._run(work)

    async def chain(
        self, response_id: str, tenant: str | None = None, max_links: int = 100_000
    ) -> list[StoredResponse] | None:
        """The stored responses from the conversation's start to ``response_id``, oldest first.

        None if ``response_id`` or a link of its chain is missing or not ``tenant``'s.
        """
        return await walk_chain(self.get, response_id, tenant, max_links)

    async def delete(self, response_id: str, tenant: str | None = None) -> bool:
        """Delete a stored response of ``tenant``; False if there was none."""
        if await self.get(response_id, tenant) is None:
            return False
        return await self._delete(response_id)

    async def _delete(self, response_id: str) -> bool:
        if response_id in self._pending:
            if response_id in self._deleted_pending:
                return False
            # The write is still queued: hide it now; the write lands hidden and is purged
            # unless a later response needs it. The tombstone, written now, keeps a journal
            # replay after a crash from bringing it back.
            self._deleted_pending.add(response_id)

            def tombstone() -> None:
                conn = self._conn()
                with conn:
                    conn.execute(
                        "INSERT OR IGNORE INTO deleted_responses VALUES (?, ?)",
                        (response_id, int(time.time())),
                    )

            await self._run(tombstone)
            return True
        needed = self._needed_by_pending()

        def work() -> bool:
            conn = self._conn()
            with conn:
                found = conn.execute(
                    "SELECT 1 FROM responses WHERE id = ? "
                    "AND id NOT IN (SELECT id FROM deleted_responses)",
                    (response_id,),
                ).fetchone()
                if found is None:
                    return False
                conn.execute(
                    "INSERT OR IGNORE INTO deleted_responses VALUES (?, ?)",
                    (response_id, int(time.time())),
                )
                _purge(conn, response_id, needed)
            return True

        return await self._run(work)

    async def ledger_rows(self) -> list[LedgerRow]:
        """Every ledger row, oldest first."""

        def work() -> list[LedgerRow]:
            rows = (
                self._conn()
                .execute("SELECT * FROM usage_ledger ORDER BY created_at, rowid")
                .fetchall()
            )
            return [LedgerRow(*row) for row in rows]

        return await self._run(work)

    async def open(self) -> None:
        """Nothing to do: the schema was created when the file was opened."""

    async def aclose(self) -> None:
        """``close`` under the async ``ResponseStore`` interface."""
        self.close()

    def close(self) -> None:
        """Close the database thread (after the post-inference queue has drained)."""

        def work() -> None:
            conn = getattr(self._local, "conn", None)
            if conn is not None:
                conn.close()
                self._local.conn = None

        self._run_sync(work)
        self._executor.shutdown(wait=True)


class _Getter(Protocol):
    async def __call__(
        self, response_id: str, tenant: str | None = None, *, include_deleted: bool = False
    ) -> StoredResponse | None: ...


async def walk_chain(
    get: _Getter, response_id: str, tenant: str | None, max_links: int
) -> list[StoredResponse] | None:
    """A stored response's chain, oldest first, read link by link through ``get`` (shared by
    every store backend); None if a link is missing or not ``tenant``'s."""
    links: list[StoredResponse] = []
    current: str | None = response_id
    while current is not None and len(links) < max_links:
        # Deleted ancestors still lend their items: deleting one response never breaks
        # continuing from a later one.
        record = await get(current, tenant, include_deleted=bool(links))
        if record is None:
            return None
        links.append(record)
        if record.self_contained:
            break
        current = record.previous_response_id
    links.reverse()
    return links


def _purge(conn: sqlite3.Connection, response_id: str, needed: set[str | None]) -> None:
    """Remove deleted rows that no stored response needs any more, from ``response_id`` up
    its chain."""
    current: str | None = response_id
    while current is not None and current not in needed:
        child = conn.execute(
            "SELECT 1 FROM responses WHERE previous_response_id = ? AND self_contained = 0 LIMIT 1",
            (current,),
        ).fetchone()
        deleted = conn.execute(
            "SELECT 1 FROM deleted_responses WHERE id = ?", (current,)
        ).fetchone()
        if child is not None or deleted is None:
            return
        row = conn.execute(
            "SELECT previous_response_id, self_contained FROM responses WHERE id = ?", (current,)
        ).fetchone()
        # The tombstone stays: a journal replay must not write the row back.
        conn.execute("DELETE FROM responses WHERE id = ?", (current,))
        current = row[0] if row is not None and not row[1] else None


def prepare_database(path: Path) -> None:
    """Create the schema and switch the file to WAL once, before worker processes open it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=_BUSY_TIMEOUT_S)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(_SCHEMA)
        conn.executescript(_TOMBSTONES)
    finally:
        conn.close()


def read_ledger(path: Path) -> list[LedgerRow]:
    """Read the ledger of a database file directly (for ``bidi-responses usage``)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT * FROM usage_ledger ORDER BY created_at, rowid").fetchall()
    finally:
        conn.close()
    return [LedgerRow(*row) for row in rows]
