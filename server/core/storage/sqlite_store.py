"""The default response store: embedded SQLite under the data directory, on one thread.

All database work runs on one dedicated thread, so the event loop never blocks on disk and
SQLite sees a single writer. Writes are queued by the post-inference stage; until a write
lands, readers see the record in memory (``store.QueuedWrites``), so a client that continues
right after ``response.completed`` finds its response even though the disk write is still
queued. The SQL itself is in ``sqlite_schema``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from .sqlite_schema import (
    BUSY_TIMEOUT_S,
    all_ledger_rows,
    create_schema,
    purge,
    tombstone,
    write_rows,
)
from .store import (
    RESPONSE_SELECT_COLUMNS,
    LedgerRow,
    QueuedWrites,
    StoredResponse,
    WriteJob,
)

T = TypeVar("T")


class Store(QueuedWrites):
    """SQLite-backed response store and usage ledger (a ``ResponseStore``)."""

    # One process owns the file: a turn may be acknowledged before its write lands.
    shared = False

    def __init__(self, path: Path) -> None:
        super().__init__()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        self._local = threading.local()
        self._run_sync(lambda: create_schema(self._conn()))

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    # -- thread plumbing -------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            # Worker processes share the file: WAL lets readers run beside the one writer,
            # and a writer waits for another process's write instead of failing. FULL (below):
            # a commit is on disk when it returns, so the journal segment that held the job
            # can be deleted.
            timeout = BUSY_TIMEOUT_S
            conn = sqlite3.connect(self._path, timeout=timeout)
            conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            self._local.conn = conn
        return conn

    def _run_sync(self, fn: Callable[[], T]) -> T:
        return self._executor.submit(fn).result()

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    # -- the database work of QueuedWrites -------------------------------------------------

    async def _write_rows(self, jobs: list[WriteJob], needed: set[str | None]) -> None:
        await self._run(lambda: write_rows(self._conn(), jobs, needed))

    async def _read(self, response_id: str, include_deleted: bool) -> StoredResponse | None:
        hidden = "" if include_deleted else " AND id NOT IN (SELECT id FROM deleted_responses)"

        def work() -> StoredResponse | None:
            row = (
                self._conn()
                .execute(
                    f"SELECT {RESPONSE_SELECT_COLUMNS} FROM responses WHERE id = ?" + hidden,
                    (response_id,),
                )
                .fetchone()
            )
            return None if row is None else StoredResponse.from_row(row)

        return await self._run(work)

    async def _hide_queued(self, response_id: str) -> None:
        # The write lands hidden and is purged unless a later response needs it. The
        # tombstone, written now, keeps a journal replay after a crash from bringing it back.
        def work() -> None:
            conn = self._conn()
            with conn:
                tombstone(conn, response_id, int(time.time()))

        await self._run(work)

    async def _landed_hidden(self, response_id: str) -> None:
        # Nothing to do: ``write_rows`` purged it (the tombstone was already there).
        return None

    async def _delete_written(self, response_id: str, needed: set[str | None]) -> bool:
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
                tombstone(conn, response_id, int(time.time()))
                purge(conn, response_id, needed)
            return True

        return await self._run(work)

    # -- the rest of ResponseStore ---------------------------------------------------------

    async def ledger_rows(self) -> list[LedgerRow]:
        """Every ledger row, oldest first."""
        return await self._run(lambda: all_ledger_rows(self._conn()))

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
