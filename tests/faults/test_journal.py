"""The journal when the disk fails under it: refuse what needs it, keep the rest, recover."""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import pytest
from bidi_responses.schema import ResponseObject
from bidi_responses.server.core.storage.journal import Journal, StorageUnavailable
from bidi_responses.server.core.storage.postinference import PostJob, PostQueue
from bidi_responses.server.core.storage.sqlite_store import Store
from bidi_responses.server.core.storage.store import StoredResponse

from tests.conftest import until
from tests.core.test_post import _row


@contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Files of this process cannot grow past ``limit`` bytes (writes fail with EFBIG)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _stored(response_id: str) -> StoredResponse:
    response = cast(ResponseObject, {"id": response_id, "created_at": 1, "output": []})
    return StoredResponse(response, [], None, True)


async def test_a_full_disk_fails_stored_jobs_keeps_ledger_rows_and_recovers(
    tmp_path: Path,
) -> None:
    async with asyncio.timeout(30):
        store = Store(tmp_path / "responses.db")
        journal = Journal(tmp_path / "journal", segment_bytes=1 << 30)
        queue = PostQueue(store, 64, journal=journal, probe_interval_s=0.01)
        await queue.start()
        await queue.put(PostJob(_stored("resp_ok"), _row("resp_ok")))
        with file_size_limit(32 * 1024):
            # Fill the segment past the limit: the append that crosses it fails.
            with pytest.raises(StorageUnavailable):
                for n in range(1000):
                    await queue.put(PostJob(_stored(f"resp_{n}"), _row(f"resp_{n}")))
            assert not queue.health.ok and queue.failed == 1
            with pytest.raises(StorageUnavailable):  # refused at once, no disk thrash
                await queue.put(PostJob(_stored("resp_refused"), _row("resp_refused")))
            assert await store.get("resp_refused") is None  # never readable
            # A response that stores nothing still gets its ledger row, held in memory.
            await queue.put(PostJob(None, _row("resp_unstored")))
            assert queue.unjournaled == 1
        # Space returns: the prober sees it.
        await until(lambda: queue.health.ok)
        await queue.put(PostJob(_stored("resp_after"), _row("resp_after")))
        await queue.drain()
        ledger = {row.response_id for row in await store.ledger_rows()}
        store.close()
        assert {"resp_ok", "resp_unstored", "resp_after"} <= ledger
        assert "resp_refused" not in ledger
        # Nothing is left for a replay: the failed segment's good records were written too.
        assert not list((tmp_path / "journal").glob("*.journal"))
