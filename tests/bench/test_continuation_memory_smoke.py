"""Smoke versions of two benchmarks: HTTP continuations turn by turn (``make
http-continuation``) and what an idle open stream holds (``make stream-memory``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from bidi_responses.bench import http_continuation, stream_memory

pytestmark = pytest.mark.timeout(120)


async def test_http_continuation_reports_every_turn(tmp_path: Path) -> None:
    async with asyncio.timeout(100):
        result = await http_continuation.run_benchmark(4, 1, tmp_path)
    rows = result["per_turn"]
    assert isinstance(rows, list) and [row["turn"] for row in rows] == [1, 2, 3, 4]
    for row in rows:
        assert isinstance(row, dict)
        server, wall = row["server_ms"], row["wall_ms"]
        assert isinstance(server, dict) and isinstance(wall, dict)
        assert 0 < server["median"] <= wall["median"]
    assert "turn" in http_continuation.format_table(result)


@pytest.mark.parametrize("transport", ["websocket", "connect"])
async def test_stream_memory_attributes_an_idle_streams_bytes(
    tmp_path: Path, transport: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with asyncio.timeout(100):
        await stream_memory.run(transport, 5, 5, tmp_path, "file")
    lines = capsys.readouterr().out.splitlines()
    head = lines[0]
    assert head.startswith(f"{transport}: 5 idle open streams, ")
    per_stream_kib = float(head.split(", ")[1].split()[0])
    assert per_stream_kib > 1  # an open stream holds something, and it is measured
    assert len(lines) == 6  # the five largest sites
