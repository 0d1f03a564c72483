"""The write-ahead journal: a finished response's ledger row and stored form are durable before
its terminal event reaches the client, without putting the SQLite writes on the critical path.

Each finished response's post-inference job is appended to the journal as one framed record
(length, CRC-32, payload) and made durable with ``fdatasync`` before the terminal event is sent.
Appends from every stream that arrive while a sync is running are written together by the next
one (group commit), so a busy server pays one sync per batch, not per response. The SQLite
writes then happen in the background (``PostQueue``); once every record of a segment file is in
SQLite (committed with ``synchronous=FULL``), the segment is deleted.

Several server processes may share one data directory: each appends to its own segment files
(named after its pid and a random tag) and holds an exclusive ``flock`` on each for its
lifetime. At start-up a process takes ``replay.lock`` and replays every segment whose lock it
can take, i.e. whose writer is gone, into SQLite (idempotently, keyed by response id), then
deletes it. A record cut short by a crash fails its CRC and ends the segment's replay: its
append never returned, so no client was told about it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import secrets
import struct
import zlib
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

_HEADER = struct.Struct("<II")  # payload length, CRC-32 of the payload
SUFFIX = ".journal"
LOCK_NAME = "replay.lock"


class StorageUnavailable(Exception):
    """The data directory cannot take writes (disk full, I/O error, file size limit...)."""


@dataclass(slots=True, eq=False)
class Segment:
    """One journal file of this process. ``records`` durable, ``applied`` of them in SQLite."""

    path: Path
    fd: int
    size: int = 0
    records: int = 0
    applied: int = 0
    sealed: bool = False


def frame(payload: bytes) -> bytes:
    """One record as written to a segment."""
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def read_records(data: bytes) -> tuple[list[bytes], int]:
    """The intact records of a segment and how many trailing bytes were torn (not intact)."""
    records: list[bytes] = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, crc = _HEADER.unpack_from(data, offset)
        start = offset + _HEADER.size
        payload = data[start : start + length]
        if len(payload) < length or zlib.crc32(payload) != crc:
            break
        records.append(payload)
        offset = start + length
    return records, len(data) - offset


class Journal:
    """This process's journal: group-committed appends, and replay of dead writers' segments.

    ``sync=False`` skips ``fdatasync`` (for measuring its cost only; a crash of the machine, not
    just of the process, could then lose acknowledged records).
    """

    def __init__(
        self, directory: Path, *, segment_bytes: int = 4 * 1024 * 1024, sync: bool = True
    ) -> None:
        self.directory = directory
        self._segment_bytes = segment_bytes
        self._sync = sync
        self._tag = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._serial = 0
        self._segment: Segment | None = None
        self._segments: list[Segment] = []
        self._batch: list[tuple[bytes, asyncio.Future[Segment]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="journal")
        self.appended = 0
        self.syncs = 0
        self._closed = False

    # -- thread plumbing -------------------------------------------------------------------

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    # -- appends ---------------------------------------------------------------------------

    async def append(self, payload: bytes) -> Segment:
        """Append one record; returns once it is durable. StorageUnavailable if it cannot be."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Segment] = loop.create_future()
        self._batch.append((frame(payload), future))
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush(), name="journal-flush")
        return await asyncio.shield(future)

    async def _flush(self) -> None:
        while self._batch:
            batch, self._batch = self._batch, []
            frames = [f for f, _ in batch]
            try:
                segment = await self._run(partial(self._write, frames))
            except OSError as exc:
                error = StorageUnavailable(f"journal write failed: {exc}")
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            self.syncs += 1
            self.appended += len(batch)
            segment.records += len(batch)
            for _, future in batch:
                if not future.done():
                    future.set_result(segment)

    def _write(self, frames: list[bytes]) -> Segment:
        """On the journal thread: write a batch at the end of the current segment and sync."""
        segment = self._segment
        if segment is None or segment.size >= self._segment_bytes:
            segment = self._rotate()
        data = b"".join(frames)
        try:
            view = memoryview(data)
            while view:
                written = os.write(segment.fd, view)
                view = view[written:]
            if self._sync:
                os.fdatasync(segment.fd)
        except OSError:
            # Leave no torn record behind if we can; either way this file takes no more
            # appends (the next batch opens a new one), and its good records stay for SQLite.
            with contextlib.suppress(OSError):
                os.ftruncate(segment.fd, segment.size)
            self._seal(segment)
            self._segment = None
            raise
        segment.size += len(data)
        return segment

    def _rotate(self) -> Segment:
        if self._segment is not None:
            self._seal(self._segment)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._serial += 1
        path = self.directory / f"{self._tag}.{self._serial:06d}{SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours while this process lives
            if self._sync:
                _sync_directory(self.directory)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        segment = Segment(path, fd)
        self._segments.append(segment)
        self._segment = segment
        return segment

    def _seal(self, segment: Segment) -> None:
        segment.sealed = True
        if segment.applied >= segment.records:
            self._remove(segment)

    def _remove(self, segment: Segment) -> None:
        if segment not in self._segments:
            return
        self._segments.remove(segment)
        with contextlib.suppress(OSError):
            segment.path.unlink()
        with contextlib.suppress(OSError):
            os.close(segment.fd)

    def applied(self, segment: Segment, count: int = 1) -> None:
        """``count`` records of ``segment`` are now in SQLite (durably)."""
        segment.applied += count
        if segment.sealed and segment.applied >= segment.records:
            self._executor.submit(self._remove, segment)

    async def probe(self) -> None:
        """Check the directory takes durable writes again (a fresh segment, one empty record).

        Raises StorageUnavailable while it does not.
        """

        def work() -> Segment:
            if self._segment is not None:
                self._seal(self._segment)
                self._segment = None
            return self._write([frame(b"")])

        try:
            segment = await self._run(work)
        except OSError as exc:
            raise StorageUnavailable(f"journal write failed: {exc}") from exc
        segment.records += 1
        self.applied(segment)  # nothing to apply for the empty record

    @property
    def segments(self) -> int:
        """Segment files this process holds open."""
        return len(self._segments)

    # -- replay at start-up ----------------------------------------------------------------

    async def replay(self, apply: Callable[[list[bytes]], Awaitable[None]]) -> tuple[int, int]:
        """Replay every orphaned segment in the directory through ``apply``, then delete it.

        ``apply`` must be idempotent and durable when it returns. Runs under ``replay.lock``, so
        concurrent start-ups replay each file once; segments whose writer still runs (their
        lock is held) are left alone. Returns the segments and records replayed.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        lock = await self._run(partial(_lock, self.directory / LOCK_NAME))
        files = records = 0
        try:
            for path in sorted(self.directory.glob(f"*{SUFFIX}")):
                taken = await self._run(partial(_take_orphan, path))
                if taken is None:
                    continue  # its writer is alive
                fd, payloads = taken
                try:
                    if payloads:
                        await apply(payloads)
                    await self._run(path.unlink)
                finally:
                    os.close(fd)
                files += 1
                records += len(payloads)
        finally:
            os.close(lock)  # releases the lock
        return files, records

    async def close(self) -> None:
        """Stop appending; delete segments whose records are all in SQLite, keep the others.

        Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._flusher is not None:
            with contextlib.suppress(BaseException):
                await self._flusher

        def work() -> None:
            for segment in list(self._segments):
                segment.sealed = True
                if segment.applied >= segment.records:
                    self._remove(segment)
                else:
                    with contextlib.suppress(OSError):
                        os.close(segment.fd)  # releases the lock: the next start replays it
                    self._segments.remove(segment)
            self._segment = None

        await self._run(work)
        self._executor.shutdown(wait=True)


def _lock(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _take_orphan(path: Path) -> tuple[int, list[bytes]] | None:
    """Lock a segment whose writer is gone and read it; None if its writer is alive."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with open(fd, "rb", closefd=False) as handle:
            data = handle.read()
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    records, torn = read_records(data)
    if torn:
        log.warning("journal %s: %d torn trailing bytes ignored", path.name, torn)
    return fd, [r for r in records if r]


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
