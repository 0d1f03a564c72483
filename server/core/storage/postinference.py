"""Post-inference work: durable before the terminal event, written to SQLite off the critical path.

``put`` runs just before a response's terminal event. It appends the job (ledger row and, with
``store: true``, the stored response) to the write-ahead journal and returns once the append is
durable: one group-committed ``fdatasync`` shared by every stream finishing at that moment. The
SQLite writes happen afterwards, in batches, on a background writer while the client already
sends its next turn; a restart replays whatever the journal holds that SQLite does not. Since
a journaled job is durable already, the writer lets a batch gather for ``write_linger_s``
before it writes: one agent loop finishes a turn every few milliseconds, and one transaction
(one WAL sync) then takes the rows of several turns instead of one each. Staged responses
are readable meanwhile (``QueuedWrites``); ``join`` and ``drain`` cut the wait short.

Disk trouble is bounded and loud (``StorageHealth``): when the journal or the database cannot
write, the cause is logged once, new ``store: true`` work is refused with 503
``storage_unavailable``, and responses that store nothing go on (their ledger rows wait in
memory, bounded, until the disk takes writes again). The writer retries with backoff and a
prober re-checks the journal, so the server recovers by itself when space returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
from collections import deque
from dataclasses import dataclass

import orjson
from bidi_responses.schema import JSONObject

from ..api.errors import ApiError
from .backend import ResponseStore
from .journal import Journal, Segment, StorageUnavailable
from .store import LedgerRow, StoredResponse

log = logging.getLogger(__name__)

__all__ = ["PostJob", "PostQueue", "StorageHealth", "StorageUnavailable"]


@dataclass(slots=True)
class PostJob:
    """What to write for one finished response."""

    record: StoredResponse | None
    ledger: LedgerRow | None
    # The journal segment holding this job (None: kept in memory only, the disk was down).
    segment: Segment | None = dataclasses.field(default=None, compare=False, repr=False)

    def to_json(self) -> bytes:
        """The job as one journal record."""
        # orjson writes the dataclasses as their fields natively; ``dataclasses.asdict`` would
        # deep-copy the whole response first, on every finished response.
        return orjson.dumps({"record": self.record, "ledger": self.ledger})

    @classmethod
    def from_json(cls, line: bytes) -> PostJob:
        """From a journal record."""
        data: JSONObject = orjson.loads(line)
        record = StoredResponse(**data["record"]) if data.get("record") else None
        ledger = LedgerRow(**data["ledger"]) if data.get("ledger") else None
        return cls(record, ledger)


class StorageHealth:
    """Whether the data directory takes writes, per component ("journal", "database").

    A change is logged once (the cause when it breaks, a line when it recovers), never once
    per request.
    """

    def __init__(self) -> None:
        self._causes: dict[str, str] = {}
        self.outages = 0

    @property
    def ok(self) -> bool:
        """True when every component takes writes."""
        return not self._causes

    def broken(self, component: str) -> bool:
        """True while ``component`` cannot write."""
        return component in self._causes

    @property
    def cause(self) -> str:
        """Why storage is unavailable ("" when it is not)."""
        return "; ".join(f"{name}: {cause}" for name, cause in self._causes.items())

    def fail(self, component: str, exc: BaseException) -> None:
        """``component`` could not write."""
        if component in self._causes:
            return
        self._causes[component] = str(exc) or type(exc).__name__
        self.outages += 1
        log.error(
            "storage unavailable (%s: %s); store:true requests are refused with "
            "storage_unavailable until writes succeed again",
            component,
            self._causes[component],
        )

    def recover(self, component: str) -> None:
        """``component`` wrote successfully."""
        if self._causes.pop(component, None) is not None:
            log.warning("storage recovered (%s takes writes again)", component)


class PostQueue:
    """Journal, then a bounded queue of SQLite writes with one background writer.

    Counters: ``written`` jobs, ``retried`` write attempts that failed and were retried,
    ``failed`` store:true jobs refused because the journal could not write, ``replayed``
    journal records written at start, ``full_waits`` producers that waited for room,
    ``unjournaled`` ledger rows kept in memory only while the disk was down.
    """

    def __init__(
        self,
        store: ResponseStore,
        maxsize: int,
        *,
        journal: Journal | None = None,
        retry_delay_s: float = 0.05,
        max_retry_delay_s: float = 2.0,
        probe_interval_s: float = 1.0,
        max_backlog: int | None = None,
        batch_max: int = 256,
        write_linger_s: float = 0.0,
    ) -> None:
        self._store = store
        self._journal = journal
        self._maxsize = maxsize
        self._max_backlog = max_backlog if max_backlog is not None else 16 * maxsize
        self._batch_max = batch_max
        self._linger_s = write_linger_s
        self._jobs: deque[PostJob] = deque()
        self._wake = asyncio.Event()
        # Set to end a linger early: a full batch, producers waiting for room, join or drain.
        self._hurry = asyncio.Event()
        self._room = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._worker: asyncio.Task[None] | None = None
        self._submitted: set[asyncio.Task[None]] = set()
        # Writes made by ``write_through`` that have not landed yet (``drain`` waits for them).
        self._through: set[asyncio.Task[bool]] = set()
        self._prober: asyncio.Task[None] | None = None
        self._retry_delay_s = retry_delay_s
        self._max_retry_delay_s = max_retry_delay_s
        self._probe_interval_s = probe_interval_s
        self.health = StorageHealth()
        self.written = 0
        self.failed = 0
        self.retried = 0
        self.replayed = 0
        self.full_waits = 0
        self.unjournaled = 0

    @property
    def journal(self) -> Journal | None:
        """The write-ahead journal (None: jobs are kept in memory until written)."""
        return self._journal

    async def start(self) -> None:
        """Replay what earlier runs left in the journal, then start the writer."""
        if self._journal is not None and self._worker is None:
            _, self.replayed = await self._journal.replay(self._apply_replayed)
            if self.replayed:
                log.info("replayed %d post-inference jobs from the journal", self.replayed)
        self._start_tasks()

    def _start_tasks(self) -> None:
        loop = asyncio.get_running_loop()
        if self._worker is None:
            self._worker = loop.create_task(self._run(), name="post-queue")
        if self._prober is None and self._journal is not None:
            self._prober = loop.create_task(self._probe(), name="journal-probe")

    async def _apply_replayed(self, payloads: list[bytes]) -> None:
        jobs = [PostJob.from_json(p) for p in payloads]
        for start in range(0, len(jobs), self._batch_max):
            chunk = jobs[start : start + self._batch_max]
            await self._store.write_many([(j.record, j.ledger) for j in chunk])

    @property
    def depth(self) -> int:
        """Jobs waiting for their SQLite write."""
        return len(self._jobs)

    @property
    def maxsize(self) -> int:
        """Jobs queued before producers wait for room (while storage is healthy)."""
        return self._maxsize

    def admit(self, store: bool) -> None:
        """Refuse new work that could not be made durable now (503 ``storage_unavailable``)."""
        if len(self._jobs) >= self._max_backlog:
            raise _unavailable(
                f"{len(self._jobs)} post-inference writes are waiting for the disk"
                + (f" ({self.health.cause})" if self.health.cause else "")
            )
        if store and not self.health.ok:
            raise _unavailable(self.health.cause)

    async def put(self, job: PostJob) -> None:
        """Make a job durable (journal), then queue its SQLite write.

        Returns once the job is durable. A job with a stored response raises
        StorageUnavailable if it cannot be made durable: its response must not be reported as
        done. A ledger-only job never fails: while the journal is down it waits in memory.
        """
        journal = self._journal
        if job.record is not None:
            if journal is not None and self.health.broken("journal"):
                self.failed += 1
                raise StorageUnavailable(self.health.cause)
            self._store.stage(job.record.response["id"], job.record)
        try:
            if journal is not None and not self.health.broken("journal"):
                try:
                    job.segment = await journal.append(job.to_json())
                except StorageUnavailable as exc:
                    self.health.fail("journal", exc)
                    self._room.set()  # producers waiting for room stop waiting
                    if job.record is not None:
                        self.failed += 1
                        raise
            if job.segment is None and journal is not None:
                self.unjournaled += 1
        except BaseException:
            if job.record is not None:
                self._store.unstage(job.record.response["id"], job.record)
            raise
        # Backpressure while the writer keeps up; never a stall while storage is down (the
        # job is durable already, or the disk is down and it can only wait in memory).
        if len(self._jobs) >= self._maxsize and self.health.ok:
            self.full_waits += 1
            while len(self._jobs) >= self._maxsize and self.health.ok:
                self._room.clear()
                await self._room.wait()
        self._jobs.append(job)
        self._idle.clear()
        self._wake.set()
        if len(self._jobs) >= min(self._batch_max, self._maxsize):
            self._hurry.set()

    async def write_through(self, job: PostJob, attempts: int = 6) -> bool:
        """Write a job now and return once it has landed (True), or, after ``attempts``
        failures, once it is queued for the writer's retries (False).

        For a shared store, whose turns are acknowledged only after their write. The write
        goes on if the caller is cancelled (the client went away), and ``drain`` waits for it.
        """
        task = asyncio.get_running_loop().create_task(
            self._write_now(job, attempts), name="post-through"
        )
        self._through.add(task)
        task.add_done_callback(self._through.discard)
        return await asyncio.shield(task)

    async def _write_now(self, job: PostJob, attempts: int) -> bool:
        delay = self._retry_delay_s
        for attempt in range(attempts):
            try:
                await self._store.write_many([(job.record, job.ledger)])
            except Exception as exc:
                self.retried += 1
                self.health.fail("database", exc)
                if attempt + 1 < attempts:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self._max_retry_delay_s)
                continue
            self.health.recover("database")
            self.written += 1
            return True
        if job.record is not None:
            self._store.stage(job.record.response["id"], job.record)
        self._jobs.append(job)
        self._idle.clear()
        self._wake.set()
        return False

    def submit(self, job: PostJob) -> None:
        """``put`` a job in the background (nobody waits for it; ``drain`` does). If storage
        cannot take its stored response, the ledger row is still kept."""

        async def put_or_keep_ledger() -> None:
            try:
                await self.put(job)
            except StorageUnavailable:
                if job.ledger is not None:
                    await self.put(PostJob(None, job.ledger))

        task = asyncio.get_running_loop().create_task(put_or_keep_ledger(), name="post-submit")
        self._submitted.add(task)
        task.add_done_callback(self._submitted.discard)

    async def _run(self) -> None:
        delay = self._retry_delay_s
        while True:
            if not self._jobs:
                self._hurry.clear()
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._linger()
            batch = list(itertools.islice(self._jobs, self._batch_max))
            try:
                await self._store.write_many([(j.record, j.ledger) for j in batch])
            except Exception as exc:
                self.retried += 1
                self.health.fail("database", exc)
                self._room.set()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._max_retry_delay_s)
                continue
            self.health.recover("database")
            delay = self._retry_delay_s
            for _ in batch:
                job = self._jobs.popleft()
                if job.segment is not None and self._journal is not None:
                    self._journal.applied(job.segment)
            self.written += len(batch)
            self._room.set()

    async def _linger(self) -> None:
        """Let more jobs join the batch, when the ones queued are durable in the journal
        already (else a crash meanwhile would lose them) and nothing hurries the writer."""
        if not self._linger_s or self._hurry.is_set() or not self.health.ok:
            return
        if any(job.segment is None for job in self._jobs):
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._linger_s):
                await self._hurry.wait()

    async def _probe(self) -> None:
        """While the journal cannot write, try it again every ``probe_interval_s``."""
        assert self._journal is not None
        while True:
            await asyncio.sleep(self._probe_interval_s)
            if not self.health.broken("journal"):
                continue
            try:
                await self._journal.probe()
            except StorageUnavailable:
                continue
            self.health.recover("journal")

    async def join(self) -> None:
        """Wait until every job queued so far is written (the writer keeps running)."""
        if self._submitted:
            await asyncio.gather(*list(self._submitted), return_exceptions=True)
        self._hurry.set()
        await self._idle.wait()

    async def drain(self, wait_s: float | None = None) -> None:
        """Write every queued job (waiting at most ``wait_s``), then stop the writer.

        Jobs still unwritten stay in the journal for the next start; only ledger rows kept in
        memory while the disk was down can be lost, and they are counted in the log.
        """
        for pending in (self._submitted, self._through):
            while pending:
                await asyncio.gather(*list(pending), return_exceptions=True)
        if self._jobs and self._worker is None:
            self._start_tasks()  # jobs were queued but the writer never ran: write them now
        self._hurry.set()
        try:
            async with asyncio.timeout(wait_s):
                await self._idle.wait()
        except TimeoutError:
            kept = sum(1 for j in self._jobs if j.segment is not None)
            log.error(
                "stopping with %d post-inference writes undone (%s): %d stay in the journal "
                "for the next start, %d ledger rows held in memory are lost",
                len(self._jobs),
                self.health.cause or "writes too slow",
                kept,
                len(self._jobs) - kept,
            )
        for task in (self._worker, self._prober):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._worker = self._prober = None
        if self._journal is not None:
            await self._journal.close()

    def counters(self) -> dict[str, int]:
        """The counters, for the stats call."""
        journal = self._journal
        return {
            "written": self.written,
            "retried": self.retried,
            "failed": self.failed,
            "replayed": self.replayed,
            "full_waits": self.full_waits,
            "unjournaled": self.unjournaled,
            "storage_ok": int(self.health.ok),
            "storage_outages": self.health.outages,
            "journal_appends": journal.appended if journal else 0,
            "journal_syncs": journal.syncs if journal else 0,
        }


def _unavailable(cause: str) -> ApiError:
    return ApiError(
        f"Storage is unavailable, so this request cannot be made durable ({cause}). "
        "Retry later, or send 'store': false.",
        code="storage_unavailable",
        status=503,
        type="server_error",
    )
