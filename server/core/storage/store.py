"""What every store backend shares: the records, their rows, and the writes still queued.

A backend (``sqlite_store.Store``, ``pg_store.PostgresStore``) subclasses ``QueuedWrites`` and
supplies only its database work; the in-memory rules live here once: a staged record is
readable before its write lands, a record deleted while its write is queued is hidden at once,
reads of another tenant's record find nothing, and a chain is walked link by link.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any

import orjson
from bidi_responses.schema import Item, ResponseObject

# The columns a stored response is written with and read back from, in both schemas.
RESPONSE_INSERT_COLUMNS = (
    "id, previous_response_id, created_at, response_json, input_json, self_contained, "
    "instructions, tenant"
)
RESPONSE_SELECT_COLUMNS = "response_json, input_json, previous_response_id, self_contained, tenant"
LEDGER_COLUMNS = (
    "response_id, tenant, model, status, input_tokens, cached_tokens, output_tokens, "
    "engine_ms, api_pre_ms, api_post_ms, transport, created_at, completed_at"
)

# One ledger row per response: the first wins, except that a finished attempt replaces the
# "cancelled" row of an attempt cut short (a retried turn with the same idempotency key).
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

    def row(self) -> tuple[str, str | None, int, bytes, bytes, bool, str | None, str | None]:
        """The values of ``RESPONSE_INSERT_COLUMNS``."""
        resp = self.response
        return (
            resp["id"],
            self.previous_response_id,
            resp["created_at"],
            orjson.dumps(resp),
            orjson.dumps(self.input_items),
            self.self_contained,
            resp.get("instructions"),
            self.tenant,
        )

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> StoredResponse:
        """From the values of ``RESPONSE_SELECT_COLUMNS`` (a database row)."""
        return cls(orjson.loads(row[0]), orjson.loads(row[1]), row[2], bool(row[3]), row[4])


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

    def row(self) -> tuple[Any, ...]:
        """The values of ``LEDGER_COLUMNS``."""
        # The fields are flat values: ``astuple``'s deep copy of each cost ~10 us a row.
        values: tuple[Any, ...] = _LEDGER_VALUES(self)
        return values


_LEDGER_VALUES = attrgetter(*(f.name for f in fields(LedgerRow)))

# What one post-inference job writes: a response and/or its ledger row.
WriteJob = tuple[StoredResponse | None, LedgerRow | None]


class QueuedWrites(ABC):
    """The part of a ``ResponseStore`` that lives in memory: records staged before their
    write lands, and deletions of records whose write is still queued.

    A subclass supplies the database work: ``_read``, ``_write_rows``, ``_delete_written``,
    and what its database needs when a queued record is deleted (``_hide_queued``) and when
    that record's write lands (``_landed_hidden``).
    """

    def __init__(self) -> None:
        self._pending: dict[str, StoredResponse] = {}
        self._deleted_pending: set[str] = set()

    # -- the database work of a backend ----------------------------------------------------

    @abstractmethod
    async def _read(self, response_id: str, include_deleted: bool) -> StoredResponse | None:
        """The written record (any tenant's), or None; deleted ones only if asked."""

    @abstractmethod
    async def _write_rows(self, jobs: list[WriteJob], needed: set[str | None]) -> None:
        """Write the jobs durably, idempotent by response id. ``needed``: the responses that
        queued continuations depend on, which a backend that purges deleted rows as it
        writes must keep."""

    @abstractmethod
    async def _delete_written(self, response_id: str, needed: set[str | None]) -> bool:
        """Delete a written response (hidden while a later response needs it); False if it
        was not there."""

    @abstractmethod
    async def _hide_queued(self, response_id: str) -> None:
        """A queued record was deleted (it is hidden in memory already)."""

    @abstractmethod
    async def _landed_hidden(self, response_id: str) -> None:
        """The write of a record deleted while queued has landed."""

    # -- the ResponseStore methods ---------------------------------------------------------

    def stage(self, response_id: str, record: StoredResponse) -> None:
        """Make a response readable in this process now; ``write`` makes it durable."""
        self._pending[response_id] = record

    def unstage(self, response_id: str, record: StoredResponse) -> None:
        """Withdraw a staged record whose write will not happen (its job was never queued)."""
        if self._pending.get(response_id) is record:
            del self._pending[response_id]

    async def write(self, record: StoredResponse | None, ledger: LedgerRow | None) -> None:
        """Write a response and/or its ledger row in one transaction (idempotent by id)."""
        await self.write_many([(record, ledger)])

    async def write_many(self, jobs: list[WriteJob]) -> None:
        """Several ``write``s, durable when it returns; idempotent by response id (journal
        replay may repeat a write that already landed)."""
        await self._write_rows(jobs, self._needed_by_pending())
        for record, _ in jobs:
            if record is None:
                continue
            response_id = record.response["id"]
            if self._pending.get(response_id) is record:
                del self._pending[response_id]
            if response_id in self._deleted_pending:
                self._deleted_pending.discard(response_id)
                await self._landed_hidden(response_id)

    def _needed_by_pending(self) -> set[str | None]:
        """Responses whose rows queued continuations will need once they are written."""
        return {r.previous_response_id for r in self._pending.values() if not r.self_contained}

    async def get(
        self, response_id: str, tenant: str | None = None, *, include_deleted: bool = False
    ) -> StoredResponse | None:
        """A stored response owned by ``tenant``, or None (absent or another tenant's).
        ``include_deleted`` also finds a deleted response whose row a later response's
        history still needs (for ``chain``)."""
        if response_id in self._deleted_pending and not include_deleted:
            return None
        record = self._pending.get(response_id)
        if record is None:
            record = await self._read(response_id, include_deleted)
        return record if record is not None and record.visible_to(tenant) else None

    async def chain(
        self, response_id: str, tenant: str | None = None, max_links: int = 100_000
    ) -> list[StoredResponse] | None:
        """The stored responses of ``tenant`` from the conversation's start to
        ``response_id``, oldest first; None if a link is missing (or another tenant's)."""
        links: list[StoredResponse] = []
        current: str | None = response_id
        while current is not None and len(links) < max_links:
            # Deleted ancestors still lend their items: deleting one response never breaks
            # continuing from a later one.
            record = await self.get(current, tenant, include_deleted=bool(links))
            if record is None:
                return None
            links.append(record)
            if record.self_contained:
                break
            current = record.previous_response_id
        links.reverse()
        return links

    async def delete(self, response_id: str, tenant: str | None = None) -> bool:
        """Delete a stored response of ``tenant``; False if there was none."""
        if await self.get(response_id, tenant) is None:
            return False
        if response_id in self._pending:
            if response_id in self._deleted_pending:
                return False
            # The write is still queued: hide it now; the backend deals with it on landing.
            self._deleted_pending.add(response_id)
            await self._hide_queued(response_id)
            return True
        return await self._delete_written(response_id, self._needed_by_pending())


class StoreUnavailable(RuntimeError):
    """The configured store cannot be reached or opened (the message names it, without
    credentials)."""


def redact(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"
