"""Post-inference work off the critical path: usage ledger and store writes.

The core enqueues a job before it sends a response's terminal event and moves on; a worker
writes the job in the background while the client already sends its next turn. The queue is
bounded (a full queue makes the producer wait: backpressure instead of unbounded memory), and
``drain`` waits for every queued job, so a graceful shutdown loses nothing.

A write that fails is retried with backoff; if it still fails (disk full, database locked for
long), the job is appended to a dead-letter file next to the database and replayed when the
server starts again. Writes are idempotent by response id, so a replay never doubles a row.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from bidi_responses.server.core.store import LedgerRow, StoredResponse
from bidi_responses.server.core.store_backend import ResponseStore

log = logging.getLogger(__name__)

DEAD_LETTER_NAME = "post-failed.jsonl"


@dataclass(slots=True)
class PostJob:
    """What to write for one finished response."""

    record: StoredResponse | None
    ledger: LedgerRow | None

    def to_json(self) -> bytes:
        """One dead-letter line."""
        return orjson.dumps(
            {
                "record": dataclasses.asdict(self.record) if self.record else None,
                "ledger": dataclasses.asdict(self.ledger) if self.ledger else None,
            }
        )

    @classmethod
    def from_json(cls, line: bytes) -> PostJob:
        """From a dead-letter line."""
        data: dict[str, Any] = orjson.loads(line)
        record = StoredResponse(**data["record"]) if data.get("record") else None
        ledger = LedgerRow(**data["ledger"]) if data.get("ledger") else None
        return cls(record, ledger)


class PostQueue:
    """A bounded queue of post-inference jobs with one background writer.

    Counters: ``written`` jobs, ``retried`` write attempts that failed and were retried,
    ``failed`` jobs that went to the dead-letter file, ``replayed`` dead-letter jobs written
    at start, ``full_waits`` producers that had to wait for room (backpressure).
    """

    def __init__(
        self,
        store: ResponseStore,
        maxsize: int,
        *,
        dead_letter: Path | None = None,
        retries: int = 5,
        retry_delay_s: float = 0.05,
    ) -> None:
        self._store = store
        self._queue: asyncio.Queue[PostJob] = asyncio.Queue(maxsize=maxsize)
        self._worker: asyncio.Task[None] | None = None
        # Writes made by ``write_through`` that have not landed yet (``drain`` waits for them).
        self._through: set[asyncio.Task[bool]] = set()
        self._ready = asyncio.Event()
        self._dead_letter = dead_letter
        self._retries = retries
        self._retry_delay_s = retry_delay_s
        self.written = 0
        self.failed = 0
        self.retried = 0
        self.replayed = 0
        self.full_waits = 0

    def start(self) -> None:
        """Start the writer on the running loop (it first replays the dead-letter file)."""
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._run(), name="post-queue")

    @property
    def depth(self) -> int:
        """Jobs waiting."""
        return self._queue.qsize()

    @property
    def maxsize(self) -> int:
        """The queue's bound."""
        return self._queue.maxsize

    async def put(self, job: PostJob) -> None:
        """Queue a job; waits while the queue is full.

        The stored response is readable at once (``Store.stage``); if the wait is cancelled,
        the job is not queued and the staged record is withdrawn.
        """
        if job.record is not None:
            self._store.stage(job.record.response["id"], job.record)
        if self._queue.full():
            self.full_waits += 1
        try:
            await self._queue.put(job)
        except BaseException:
            if job.record is not None:
                self._store.unstage(job.record.response["id"], job.record)
            raise

    async def write_through(self, job: PostJob) -> bool:
        """Write a job now, with the queue's retries and dead-letter file, and return once it
        has landed (True) or been kept for replay (False).

        For a shared store, whose turns are acknowledged only after their write. The write
        goes on if the caller is cancelled (the client went away), and ``drain`` waits for it.
        """
        task = asyncio.get_running_loop().create_task(self._write(job), name="post-through")
        self._through.add(task)
        task.add_done_callback(self._through.discard)
        return await asyncio.shield(task)

    async def _run(self) -> None:
        try:
            await self._replay()
        finally:
            self._ready.set()
        while True:
            job = await self._queue.get()
            try:
                await self._write(job)
            finally:
                self._queue.task_done()

    async def _write(self, job: PostJob) -> bool:
        delay = self._retry_delay_s
        for attempt in range(self._retries + 1):
            try:
                await self._store.write(job.record, job.ledger)
            except Exception:
                if attempt == self._retries:
                    break
                self.retried += 1
                log.warning("post-inference write failed; retrying in %.2f s", delay, exc_info=True)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            else:
                self.written += 1
                return True
        self.failed += 1
        log.exception("post-inference write failed %d times", self._retries + 1)
        self._bury(job)
        return False

    def _bury(self, job: PostJob) -> None:
        if self._dead_letter is None:
            log.error("no dead-letter file: lost post-inference job %s", job.to_json()[:200])
            return
        try:
            with open(self._dead_letter, "ab") as handle:
                handle.write(job.to_json() + b"\n")
            log.error(
                "post-inference job kept in %s for replay at the next start", self._dead_letter
            )
        except OSError:
            log.exception("could not write the dead-letter file; lost job %s", job.to_json()[:200])

    def _take_dead_letters(self) -> tuple[Path | None, list[bytes]]:
        """Move the dead-letter file aside for replay; returns it and its lines."""
        path = self._dead_letter
        if path is None:
            return None, []
        replaying = path.with_name(path.name + ".replaying")
        if path.exists():
            if replaying.exists():  # an earlier replay was interrupted: keep both
                with open(replaying, "ab") as handle:
                    handle.write(path.read_bytes())
                path.unlink()
            else:
                path.rename(replaying)
        if not replaying.exists():
            return None, []
        return replaying, [line for line in replaying.read_bytes().splitlines() if line.strip()]

    async def _replay(self) -> None:
        """Write the jobs an earlier run could not (idempotent), then forget them."""
        replaying, lines = self._take_dead_letters()
        if replaying is None:
            return
        for line in lines:
            try:
                job = PostJob.from_json(line)
            except (ValueError, TypeError, KeyError):
                log.exception("unreadable dead-letter line; skipped")
                continue
            if await self._write(job):  # a failure goes back to the dead-letter file
                self.replayed += 1
        replaying.unlink()
        log.info(
            "replayed %d of %d post-inference jobs from %s",
            self.replayed,
            len(lines),
            self._dead_letter,
        )

    async def join(self) -> None:
        """Wait until every job queued so far is written (the writer keeps running)."""
        if self._worker is not None:
            await self._ready.wait()
        await self._queue.join()

    async def drain(self) -> None:
        """Wait until every queued job is written, then stop the writer."""
        if self._worker is not None and self._worker.done():
            log.error("post-inference writer had stopped; restarting it to drain")
            self._worker = None
        if self._worker is None and self._queue.qsize():
            self.start()  # jobs were queued but the writer never ran: write them now
        if self._worker is not None:
            await self._ready.wait()
        await self._queue.join()
        while self._through:
            await asyncio.gather(*list(self._through), return_exceptions=True)
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
