"""Stored responses and the usage ledger in a shared PostgreSQL database (asyncpg).

The same tables and semantics as the SQLite store (``sqlite_store.py``; the rules both keep
in memory are in ``store.py``), so that several replicas behind a proxy share one store: a
continuation lands on any replica and finds its chain.
The schema is brought up to date by numbered migrations under an advisory lock, so replicas
that start together migrate once. Writes are idempotent by response id: a response written
twice (a replayed dead-letter job, or a retried turn with the same idempotency key on two
replicas) keeps one row and its first ledger row.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import asyncpg

from .store import (
    LEDGER_COLUMNS,
    LEDGER_CONFLICT_RULE,
    RESPONSE_INSERT_COLUMNS,
    RESPONSE_SELECT_COLUMNS,
    LedgerRow,
    QueuedWrites,
    StoredResponse,
    StoreUnavailable,
    WriteJob,
    redact,
)

log = logging.getLogger(__name__)

# Any 64-bit constant: the lock that serialises replicas migrating the same database.
_MIGRATION_LOCK = 0x6269646972657370


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema step; applied once, in order, recorded in ``schema_migrations``."""

    version: int
    description: str
    sql: str


# Columns mirror the SQLite schema one for one (tests/store checks it), plus ``seq`` to order
# the ledger as SQLite's rowid does.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "responses and usage ledger",
        """
        CREATE TABLE responses (
            id TEXT PRIMARY KEY,
            previous_response_id TEXT,
            created_at BIGINT NOT NULL,
            response_json BYTEA NOT NULL,
            input_json BYTEA NOT NULL,
            self_contained BOOLEAN NOT NULL,
            instructions TEXT
        );
        CREATE TABLE usage_ledger (
            response_id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            model TEXT NOT NULL,
            status TEXT NOT NULL,
            input_tokens BIGINT NOT NULL,
            cached_tokens BIGINT NOT NULL,
            output_tokens BIGINT NOT NULL,
            engine_ms DOUBLE PRECISION NOT NULL,
            api_pre_ms DOUBLE PRECISION NOT NULL,
            api_post_ms DOUBLE PRECISION NOT NULL,
            transport TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            completed_at BIGINT,
            seq BIGINT GENERATED ALWAYS AS IDENTITY
        );
        CREATE INDEX usage_ledger_order ON usage_ledger (created_at, seq);
        """,
    ),
    Migration(
        2,
        "conversation states left by draining replicas (handoff.py)",
        """
        CREATE TABLE conversation_states (
            response_id TEXT PRIMARY KEY,
            state BYTEA NOT NULL,
            saved_at TIMESTAMPTZ NOT NULL DEFAULT now()
        );
        CREATE INDEX conversation_states_age ON conversation_states (saved_at);
        """,
    ),
    Migration(
        3,
        "the tenant that owns each stored response (NULL on an open server)",
        """
        ALTER TABLE responses ADD COLUMN tenant TEXT;
        """,
    ),
    Migration(
        4,
        "deleted responses kept, hidden, while a later response's history needs them",
        """
        CREATE TABLE deleted_responses (
            id TEXT PRIMARY KEY,
            deleted_at BIGINT NOT NULL
        );
        CREATE INDEX responses_previous ON responses (previous_response_id);
        """,
    ),
)


async def _purge(conn: Any, response_id: str, needed: set[str | None]) -> None:
    """Remove deleted rows no stored response needs any more, from ``response_id`` up its
    chain (as ``sqlite_schema.purge`` does for SQLite). The tombstone stays: a journal replay
    must not write the row back."""
    current: str | None = response_id
    while current is not None and current not in needed:
        child = await conn.fetchrow(
            "SELECT 1 FROM responses WHERE previous_response_id = $1 AND NOT self_contained "
            "LIMIT 1",
            current,
        )
        deleted = await conn.fetchrow("SELECT 1 FROM deleted_responses WHERE id = $1", current)
        if child is not None or deleted is None:
            return
        row = await conn.fetchrow(
            "SELECT previous_response_id, self_contained FROM responses WHERE id = $1", current
        )
        await conn.execute("DELETE FROM responses WHERE id = $1", current)
        current = row[0] if row is not None and not row[1] else None


async def migrate(conn: Any) -> list[int]:
    """Apply the migrations this database lacks; returns the versions applied."""
    applied: list[int] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            "version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
            "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        current = await conn.fetchval("SELECT coalesce(max(version), 0) FROM schema_migrations")
        for migration in MIGRATIONS:
            if migration.version <= current:
                continue
            await conn.execute(migration.sql)
            await conn.execute(
                "INSERT INTO schema_migrations (version, description) VALUES ($1, $2)",
                migration.version,
                migration.description,
            )
            applied.append(migration.version)
    return applied


class PostgresStore(QueuedWrites):
    """The ``ResponseStore`` on a shared PostgreSQL database."""

    shared = True

    def __init__(self, url: str, *, pool_size: int = 4, connect_timeout_s: float = 30.0) -> None:
        super().__init__()
        self._url = url
        self._pool_size = pool_size
        self._connect_timeout_s = connect_timeout_s
        self._pool: Any = None

    @property
    def url(self) -> str:
        """The connection URL."""
        return self._url

    async def open(self) -> None:
        """Connect a pool and migrate the schema."""
        if self._pool is not None:
            return
        # Replicas may start before the database accepts connections: retry until the deadline.
        deadline = time.monotonic() + self._connect_timeout_s
        delay = 0.1
        while True:
            try:
                pool = await asyncpg.create_pool(
                    self._url, min_size=1, max_size=self._pool_size, command_timeout=30
                )
                break
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
                if time.monotonic() + delay > deadline:
                    raise StoreUnavailable(
                        f"cannot open the store at {redact(self._url)} "
                        f"(tried for {self._connect_timeout_s:g} s): {error}"
                    ) from error
                log.warning("store at %s not reachable yet: %s", redact(self._url), error)
                await asyncio.sleep(delay)  # backoff between connection attempts
                delay = min(delay * 2, 2.0)
        try:
            async with pool.acquire() as conn:
                await migrate(conn)
        except BaseException:
            await pool.close()
            raise
        self._pool = pool

    def _require(self) -> Any:
        if self._pool is None:
            raise RuntimeError("PostgresStore used before open()")
        return self._pool

    # -- the database work of QueuedWrites -------------------------------------------------

    async def _write_rows(self, jobs: list[WriteJob], needed: set[str | None]) -> None:
        # Each job in its own transaction (each is idempotent).
        pool = self._require()
        for record, ledger in jobs:
            async with pool.acquire() as conn, conn.transaction():
                if record is not None:
                    await conn.execute(
                        f"INSERT INTO responses ({RESPONSE_INSERT_COLUMNS}) "
                        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8) "
                        "ON CONFLICT (id) DO UPDATE SET previous_response_id = "
                        "EXCLUDED.previous_response_id, created_at = EXCLUDED.created_at, "
                        "response_json = EXCLUDED.response_json, "
                        "input_json = EXCLUDED.input_json, "
                        "self_contained = EXCLUDED.self_contained, "
                        "instructions = EXCLUDED.instructions, tenant = EXCLUDED.tenant",
                        *record.row(),
                    )
                    # A replayed write of a response deleted since: purge it again.
                    rid = record.response["id"]
                    if await conn.fetchrow("SELECT 1 FROM deleted_responses WHERE id = $1", rid):
                        await _purge(conn, rid, needed)
                if ledger is not None:
                    await conn.execute(
                        f"INSERT INTO usage_ledger ({LEDGER_COLUMNS}) VALUES "
                        "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) "
                        + LEDGER_CONFLICT_RULE,
                        *ledger.row(),
                    )

    async def _hide_queued(self, response_id: str) -> None:
        # Nothing to do yet: ``_landed_hidden`` deletes it once its write lands.
        return None

    async def _landed_hidden(self, response_id: str) -> None:
        # Deleted while its write was queued: delete it now that it has landed.
        await self._delete_written(response_id, self._needed_by_pending())

    async def _read(self, response_id: str, include_deleted: bool) -> StoredResponse | None:
        hidden = "" if include_deleted else " AND id NOT IN (SELECT id FROM deleted_responses)"
        row = await self._require().fetchrow(
            f"SELECT {RESPONSE_SELECT_COLUMNS} FROM responses WHERE id = $1" + hidden,
            response_id,
        )
        return None if row is None else StoredResponse.from_row(tuple(row))

    async def _delete_written(self, response_id: str, needed: set[str | None]) -> bool:
        async with self._require().acquire() as conn, conn.transaction():
            found = await conn.fetchrow(
                "SELECT 1 FROM responses WHERE id = $1 "
                "AND id NOT IN (SELECT id FROM deleted_responses)",
                response_id,
            )
            if found is None:
                return False
            await conn.execute(
                "INSERT INTO deleted_responses VALUES ($1, $2) ON CONFLICT DO NOTHING",
                response_id,
                int(time.time()),
            )
            # A state left by a draining replica must not revive a deleted response.
            await conn.execute(
                "DELETE FROM conversation_states WHERE response_id = $1", response_id
            )
            await _purge(conn, response_id, needed)
        return True

    # -- the rest of ResponseStore ---------------------------------------------------------

    async def ledger_rows(self) -> list[LedgerRow]:
        """Every ledger row, oldest first."""
        rows = await self._require().fetch(
            f"SELECT {LEDGER_COLUMNS} FROM usage_ledger ORDER BY created_at, seq"
        )
        return [LedgerRow(*row) for row in rows]

    # -- the state tier (handoff.py) ------------------------------------------------------------

    async def save_states(self, states: list[tuple[str, bytes]], ttl_s: float) -> None:
        """Keep each (response id, encoded state); drop states older than ``ttl_s``."""
        async with self._require().acquire() as conn, conn.transaction():
            await conn.execute(
                "DELETE FROM conversation_states "
                "WHERE saved_at < now() - make_interval(secs => $1)",
                float(ttl_s),
            )
            if states:
                await conn.executemany(
                    "INSERT INTO conversation_states (response_id, state) VALUES ($1, $2) "
                    "ON CONFLICT (response_id) DO UPDATE SET state = EXCLUDED.state, "
                    "saved_at = now()",
                    states,
                )

    async def take_state(self, response_id: str) -> bytes | None:
        """Remove and return the state saved for ``response_id`` (one taker wins)."""
        state: bytes | None = await self._require().fetchval(
            "DELETE FROM conversation_states WHERE response_id = $1 RETURNING state",
            response_id,
        )
        return state

    async def aclose(self) -> None:
        """Close the pool (after the post-inference queue has drained)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
