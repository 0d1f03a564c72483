"""The SQLite store's SQL: its schema, the batched write transaction and the purge of deleted
rows, plus the file-level helpers used without a running store (workers, ``usage``).

Everything here runs on the store's database thread (or before any store is open).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from .store import (
    LEDGER_COLUMNS,
    LEDGER_CONFLICT_RULE,
    RESPONSE_INSERT_COLUMNS,
    LedgerRow,
    WriteJob,
)

BUSY_TIMEOUT_S = 10.0

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


def create_schema(conn: sqlite3.Connection) -> None:
    """Create the tables, and bring a database from before tenants up to date."""
    conn.executescript(_SCHEMA)
    columns = {row[1] for row in conn.execute("PRAGMA table_info(responses)")}
    if "tenant" not in columns:  # a database from before tenants
        with conn:
            conn.execute("ALTER TABLE responses ADD COLUMN tenant TEXT")
    conn.executescript(_TOMBSTONES)


def write_rows(conn: sqlite3.Connection, jobs: list[WriteJob], needed: set[str | None]) -> None:
    """Write a batch of jobs in one transaction: a response row already there is kept, and one
    deleted meanwhile is purged at once unless a response in ``needed`` depends on it."""
    with conn:
        for record, ledger in jobs:
            if record is not None:
                conn.execute(
                    f"INSERT OR IGNORE INTO responses ({RESPONSE_INSERT_COLUMNS}) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    record.row(),
                )
                purge(conn, record.response["id"], needed)
            if ledger is not None:
                conn.execute(
                    f"INSERT INTO usage_ledger ({LEDGER_COLUMNS}) VALUES "
                    "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) " + LEDGER_CONFLICT_RULE,
                    ledger.row(),
                )


def tombstone(conn: sqlite3.Connection, response_id: str, now: int) -> None:
    """Mark a response deleted (kept for good: a journal replay must not bring it back)."""
    conn.execute("INSERT OR IGNORE INTO deleted_responses VALUES (?, ?)", (response_id, now))


def purge(conn: sqlite3.Connection, response_id: str, needed: set[str | None]) -> None:
    """Remove deleted rows that no stored response needs any more, from ``response_id`` up
    its chain."""
    current: str | None = response_id
    while current is not None and current not in needed:
        deleted = conn.execute(
            "SELECT 1 FROM deleted_responses WHERE id = ?", (current,)
        ).fetchone()
        if deleted is None:  # the common case, checked first: one key lookup per write
            return
        child = conn.execute(
            "SELECT 1 FROM responses WHERE previous_response_id = ? AND self_contained = 0 LIMIT 1",
            (current,),
        ).fetchone()
        if child is not None:
            return
        row = conn.execute(
            "SELECT previous_response_id, self_contained FROM responses WHERE id = ?", (current,)
        ).fetchone()
        # The tombstone stays: a journal replay must not write the row back.
        conn.execute("DELETE FROM responses WHERE id = ?", (current,))
        current = row[0] if row is not None and not row[1] else None


def all_ledger_rows(conn: sqlite3.Connection) -> list[LedgerRow]:
    """Every ledger row, oldest first."""
    rows = conn.execute(
        f"SELECT {LEDGER_COLUMNS} FROM usage_ledger ORDER BY created_at, rowid"
    ).fetchall()
    return [LedgerRow(*row) for row in rows]


def prepare_database(path: Path) -> None:
    """Create the schema and switch the file to WAL once, before worker processes open it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        create_schema(conn)
    finally:
        conn.close()


def read_ledger(path: Path) -> list[LedgerRow]:
    """Read the ledger of a database file directly (for ``bidi-responses usage``)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return all_ledger_rows(conn)
    finally:
        conn.close()
