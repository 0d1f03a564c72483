"""The store backend interface, and the choice of backend from the configured URL.

Two backends implement ``ResponseStore`` with the same semantics (the conformance suite in
``tests/store/`` runs every test against both):

* ``Store`` (``sqlite_store.py``): embedded SQLite under the data directory, the default, for one
  process on one machine.
* ``PostgresStore`` (``pg_store.py``): a shared PostgreSQL database, for several replicas
  behind a proxy, so a ``store: true`` continuation finds its predecessor on any replica.

The semantics both keep: a staged record is readable at once and durable once ``write``
returns; ``write`` is idempotent by response id (a replay never doubles a ledger row: the
first row of a response wins, except that a finished attempt replaces a ``cancelled`` one);
``delete`` of a record whose write is still queued hides it now and deletes it when the write
lands; ``chain`` walks ``previous_response_id`` links back to a self-contained record.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from .sqlite_store import Store
from .store import LedgerRow, StoredResponse, WriteJob


class ResponseStore(Protocol):
    """Stored responses, their input items, and the usage ledger."""

    @property
    def shared(self) -> bool:
        """True when other processes read the same store (a turn is acknowledged only after
        its write lands, so any replica can continue it)."""
        ...

    async def open(self) -> None:
        """Connect and bring the schema up to date (called once, on the running loop)."""
        ...

    def stage(self, response_id: str, record: StoredResponse) -> None:
        """Make a response readable in this process now; ``write`` makes it durable."""
        ...

    def unstage(self, response_id: str, record: StoredResponse) -> None:
        """Withdraw a staged record whose write will not happen."""
        ...

    async def write(self, record: StoredResponse | None, ledger: LedgerRow | None) -> None:
        """Write a response and/or its ledger row in one transaction (idempotent by id)."""
        ...

    async def write_many(self, jobs: list[WriteJob]) -> None:
        """Several ``write``s, durable when it returns (one transaction where possible)."""
        ...

    # Tenancy: every record has an owner (``StoredResponse.tenant``, None on an open server).
    # Reads and deletes take the caller's tenant and treat another tenant's record exactly
    # like a missing one.

    async def get(
        self, response_id: str, tenant: str | None = None, *, include_deleted: bool = False
    ) -> StoredResponse | None:
        """A stored response owned by ``tenant``, or None; ``include_deleted`` also finds a
        deleted one whose row a later stored response still needs."""
        ...

    async def chain(
        self, response_id: str, tenant: str | None = None, max_links: int = 100_000
    ) -> list[StoredResponse] | None:
        """The stored responses of ``tenant`` from the conversation's start to
        ``response_id``, oldest first (deleted ancestors included); None if ``response_id`` or
        a link is missing (or another tenant's)."""
        ...

    async def delete(self, response_id: str, tenant: str | None = None) -> bool:
        """Delete a stored response of ``tenant``; False if there was none. Its row stays,
        hidden, while a later stored response needs it (continuing from that one keeps
        working)."""
        ...

    async def ledger_rows(self) -> list[LedgerRow]:
        """Every ledger row, oldest first."""
        ...

    async def aclose(self) -> None:
        """Release connections (after the post-inference queue has drained)."""
        ...


def check_store_url(url: str) -> str:
    """``url`` if it names a supported backend; ValueError naming ``store.url`` otherwise."""
    if url and not url.startswith("sqlite:///") and not is_postgres_url(url):
        raise ValueError(
            f"store.url: unsupported URL '{url.split('://')[0]}://...' "
            "(expected 'sqlite:///PATH' or 'postgresql://...')"
        )
    return url


def is_postgres_url(url: str) -> bool:
    """True for a PostgreSQL connection URL."""
    return url.startswith(("postgresql://", "postgres://"))


def open_store(
    url: str, default_path: Path, *, pool_size: int = 4, connect_timeout_s: float = 30.0
) -> ResponseStore:
    """The backend a store URL names: ``""`` or ``sqlite:///PATH`` for SQLite (the default
    file under the data directory when empty), ``postgresql://...`` for PostgreSQL."""
    check_store_url(url)
    if not url:
        return Store(default_path)
    if url.startswith("sqlite:///"):
        return Store(Path(url.removeprefix("sqlite:///")))
    from .pg_store import PostgresStore

    return PostgresStore(url, pool_size=pool_size, connect_timeout_s=connect_timeout_s)
