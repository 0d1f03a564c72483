"""Persistence: stored responses and the usage ledger (SQLite or PostgreSQL), the write-ahead
journal and post-inference writes, idempotency keys, and the handoff tier for cached state."""
