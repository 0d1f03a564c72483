"""Fixtures of the store conformance suite: every test runs on SQLite and on PostgreSQL.

PostgreSQL is Debian's server, started once per session in a temp directory on a loopback
port (``bidi_responses.cluster.postgres``); each test gets a fresh database, so migrations run
from scratch every time. Where PostgreSQL is not installed the PostgreSQL cases skip and say so.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
from bidi_responses.cluster.postgres import PostgresUnavailable, TempPostgres
from bidi_responses.server.core.storage.backend import ResponseStore, open_store

BACKENDS = ("sqlite", "postgres")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[TempPostgres]:
    """One PostgreSQL server for the session."""
    try:
        server = TempPostgres()
    except PostgresUnavailable as error:
        pytest.skip(f"PostgreSQL backend not tested: {error}")
    with server:
        yield server


async def fresh_database(server: TempPostgres) -> str:
    """A new empty database on ``server``; returns its URL."""
    name = f"t_{os.urandom(6).hex()}"
    conn = await asyncpg.connect(server.url)
    try:
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    return server.url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store URL of each backend: a fresh SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'responses.db'}"
        return
    server: TempPostgres = request.getfixturevalue("postgres_server")
    import asyncio

    yield asyncio.run(fresh_database(server))


@pytest.fixture
async def store(store_url: str, tmp_path: Path) -> AsyncIterator[ResponseStore]:
    """An opened store of each backend, closed after the test."""
    backend = open_store(store_url, tmp_path / "unused.db")
    await backend.open()
    try:
        yield backend
    finally:
        await backend.aclose()
