"""Post-inference work off the critical path: usage ledger and store writes.

The core enqueues a job before it sends a response's terminal event and moves on; a worker
writes the job in the background while the client already sends its next turn. The queue is
bounded (a full queue makes the producer wait: backpressure instead of unbounded memory), and
``drain`` waits for every queued job, so a graceful shutdown loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from bidi_responses.server.core.store import LedgerRow, Store, StoredResponse

log = logging.getLogger(__name__)


@dataclass(slots=True)
class PostJob:
    """What to write for one finished response."""

    record: StoredResponse | None
    ledger: LedgerRow | None


class PostQueue:
    """A bounded queue of post-inference jobs with one background writer."""

    def __init__(self, store: Store, maxsize: int) -> None:
        self._store = store
        self._queue: asyncio.Queue[PostJob] = asyncio.Queue(maxsize=maxsize)
        self._worker: asyncio.Task[None] | None = None
        self.written = 0
        self.failed = 0

    def start(self) -> None:
        """Start the writer on the running loop."""
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._run(), name="post-queue")

    @property
    def depth(self) -> int:
        """Jobs waiting."""
        return self._queue.qsize()

    async def put(self, job: PostJob) -> None:
        """Queue a job; waits while the queue is full."""
        if job.record is not None:
            self._store.stage(job.record.response["id"], job.record)
        await self._queue.put(job)

    async def _run(self) -> None:
        while True:
            job = await self._queue.get()
            try:
                await self._store.write(job.record, job.ledger)
                self.written += 1
            except Exception:
                self.failed += 1
                log.exception("post-inference write failed")
            finally:
                self._queue.task_done()

    async def drain(self) -> None:
        """Wait until every queued job is written, then stop the writer."""
        await self._queue.join()
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
            self._worker = None
