"""``bidi-responses usage``: the ledger summarized by tenant, model, transport or status."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from bidi_responses.client import AsyncResponsesClient
from bidi_responses.server.cli import main
from bidi_responses.server.core.storage.sqlite_store import Store
from bidi_responses.server.core.storage.store import LedgerRow
from bidi_responses.server.usage import parse_since, summarize

from tests.conftest import ServerFactory


def _row(
    n: int, tenant: str, model: str, status: str = "completed", created: int = 1_700_000_000
) -> LedgerRow:
    return LedgerRow(
        f"resp_{n}",
        tenant,
        model,
        status,
        100,
        40,
        10,
        50.0,
        1.5,
        0.5,
        "grpc",
        created,
        created + 1,
    )


async def _ledger(data_dir: Path, rows: list[LedgerRow]) -> None:
    store = Store(data_dir / "responses.db")
    for row in rows:
        await store.write(None, row)
    store.close()


async def test_summary_groups_and_totals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await _ledger(
        tmp_path,
        [
            _row(1, "acme", "sim-model"),
            _row(2, "acme", "sim-other"),
            _row(3, "globex", "sim-model", "cancelled"),
            _row(4, "acme", "sim-model", created=1),
        ],
    )
    by_tenant = summarize(tmp_path, "tenant")
    assert [(g["tenant"], g["responses"], g["input_tokens"]) for g in by_tenant] == [
        ("acme", 3, 300),
        ("globex", 1, 100),
    ]
    assert by_tenant[0]["cached_share"] == 0.4
    by_two = summarize(tmp_path, "tenant,status")
    assert [(g["tenant"], g["status"]) for g in by_two] == [
        ("acme", "completed"),
        ("globex", "cancelled"),
    ]
    assert [g["responses"] for g in summarize(tmp_path, "model", since=1000)] == [2, 1]

    assert main(["usage", "--data-dir", str(tmp_path), "--by", "model", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["total"]["responses"] == 4 and document["total"]["output_tokens"] == 40
    assert main(["usage", "--data-dir", str(tmp_path), "--by", "transport"]) == 0
    table = capsys.readouterr().out
    assert "grpc" in table and "total" in table and "40.0%" in table
    assert main(["usage", "--data-dir", str(tmp_path), "--by", "colour"]) == 1
    assert "cannot group by 'colour'" in capsys.readouterr().out
    assert main(["usage", "--data-dir", str(tmp_path / "none")]) == 1
    assert "no ledger" in capsys.readouterr().out


def test_parse_since() -> None:
    assert parse_since("15m", now=10_000) == 10_000 - 900
    assert parse_since("2h", now=10_000) == 10_000 - 7200
    assert parse_since("1700000000") == 1_700_000_000
    with pytest.raises(ValueError, match="invalid --since"):
        parse_since("yesterday")


async def test_the_server_writes_one_row_per_finished_response(
    server_factory: ServerFactory,
) -> None:
    async with asyncio.timeout(30):
        running = await server_factory()
        async with AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client:
            async with client.connect() as stream:
                first = await stream.create(model="sim-model", input="hi", user="acme")
                second = await stream.create(
                    model="sim-other",
                    input="hi",
                    user="acme",
                    previous_response_id=first.id,
                    store=False,
                )
            third = await client.create(model="sim-model", input="hi", max_output_tokens=16)
        await running.core.deps.post.join()
        rows = {r.response_id: r for r in await running.core.deps.store.ledger_rows()}
        assert set(rows) == {first.id, second.id, third.id}
        assert (rows[first.id].tenant, rows[first.id].transport) == ("acme", "grpc")
        assert rows[second.id].model == "sim-other" and rows[second.id].cached_tokens > 0
        assert rows[third.id].tenant == "anonymous" and rows[third.id].status == "incomplete"
        assert rows[third.id].transport == "grpc-unary"
        assert all(r.engine_ms >= 0 and r.api_pre_ms > 0 for r in rows.values())
        # store=False: a ledger row, but no stored response.
        assert await running.core.deps.store.get(second.id) is None
