"""Persistence: stored responses and the usage ledger (SQLite or PostgreSQL), the write-ahead
journal and post-inference writes, idempotency keys, and the handoff tier for cached state."""

from .backend import ResponseStore, open_store
from .handoff import StateTier
from .history import stored_history
from .journal import Journal, StorageUnavailable
from .postinference import PostJob, PostQueue
from .store import LedgerRow, StoredResponse, StoreUnavailable

__all__ = [
    "Journal",
    "LedgerRow",
    "PostJob",
    "PostQueue",
    "ResponseStore",
    "StateTier",
    "StorageUnavailable",
    "StoreUnavailable",
    "StoredResponse",
    "open_store",
    "stored_history",
]
