"""Fixtures for the HTTP+SSE tests: a server with HTTP on, and an httpx client for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from bidi_responses.server.app import RunningServer


def http_client(running: RunningServer, timeout: float = 10) -> httpx.AsyncClient:
    """A raw HTTP client for ``running``'s HTTP port."""
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{running.http_port}", timeout=timeout)


@pytest.fixture
async def http(http_server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    """A raw HTTP client for ``http_server``."""
    async with http_client(http_server) as client:
        yield client


def parse_sse(raw: bytes) -> list[dict[str, Any]]:
    """Parse an SSE body as the strictest clients do, asserting the framing on the way.

    Each event must be exactly ``event: <type>\\n`` + one ``data: <json>\\n`` + ``\\n``, with
    the ``event:`` name equal to the JSON ``type``; no ``\\r``, no ``[DONE]``, no comments.
    """
    assert b"\r" not in raw
    assert raw.endswith(b"\n\n")
    events = []
    for block in raw[:-2].split(b"\n\n"):
        lines = block.split(b"\n")
        assert len(lines) == 2, block
        assert lines[0].startswith(b"event: ") and lines[1].startswith(b"data: "), block
        data = orjson.loads(lines[1][len(b"data: ") :])
        assert lines[0][len(b"event: ") :].decode() == data["type"]
        events.append(data)
    return events
