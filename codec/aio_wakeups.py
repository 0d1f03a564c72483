"""grpc.aio's completion wake-ups, drained: a busy event loop no longer stalls every call.

grpc.aio hands completions to the event loop through a socket pair. Its poller thread queues
each completion and writes one byte to the pair; the loop's reader for the other end reads one
byte and then runs every queued completion. So when several completions arrive between two
turns of the loop, which is the normal case on a busy server, one byte is read for several
written. The bytes pile up, and the reader stays ready, so it runs on every turn of the loop.
Once the pair's buffer is full (278 one-byte writes with Linux's default buffer), the poller
thread blocks in ``write``. No completion reaches the loop until the loop has read about half
the buffer back, one byte per turn. With 100 streams beside a loop kept busy by token-paced
work, every write in flight stalled for ~230 ms, about three times a second
(``bench/aio_busy_loop.py``). A client's loop with many streams has the same hand-over, so the
server and the project's client both drain it.

``drain_completion_wakeups`` wraps that reader: before grpc's own handler runs, it reads all but
one of the waiting bytes (grpc's ``recv(1)`` takes the last, so it never blocks). Nothing is
lost: the poller queues a completion before it writes its byte, and grpc's handler runs the
whole queue. The wrapper is installed once per loop. It needs the default selector event loop
and grpc's ``PollerCompletionQueue``. Without them it installs nothing and says so, once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import selectors
import weakref
from collections.abc import Callable

try:  # (POSIX only: elsewhere nothing is drained)
    import fcntl
    import termios
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]
    termios = None  # type: ignore[assignment]

log = logging.getLogger("bidi_responses.grpc")

# The reader installed on each loop, looked for again once it is no longer registered (grpc.aio
# shut down and started again); and the loops where none could be, which the log names once.
_INSTALLED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _DrainingReader] = (
    weakref.WeakKeyDictionary()
)
_UNDRAINED: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()

# grpc.aio's reader for its completion wake-ups, as the loop holds it: a functools.partial of
# this method (grpcio 1.85).
_GRPC_HANDLER = "PollerCompletionQueue._handle_events"


class _DrainingReader:
    """The loop's reader for grpc's wake-up socket: the waiting bytes but one, then grpc's
    handler."""

    __slots__ = ("drained_bytes", "fd", "handler")

    def __init__(self, fd: int, handler: Callable[[], object]) -> None:
        self.fd = fd
        self.handler = handler
        #: Bytes read here that grpc would have read one per turn of the loop.
        self.drained_bytes = 0

    def __call__(self) -> None:
        waiting = pending_bytes(self.fd)
        if waiting > 1:
            self.drained_bytes += len(os.read(self.fd, waiting - 1))
        self.handler()


def pending_bytes(fd: int) -> int:
    """Bytes waiting to be read on the socket ``fd`` (0 where this cannot be asked)."""
    if fcntl is None:  # pragma: no cover
        return 0
    return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), "little")


def completion_reader(loop: asyncio.AbstractEventLoop) -> _DrainingReader | None:
    """The draining reader installed on ``loop``, if it is still there."""
    reader = _INSTALLED.get(loop)
    return reader if reader is not None and _registered(loop, reader) else None


def drain_completion_wakeups(loop: asyncio.AbstractEventLoop | None = None) -> bool:
    """Wrap grpc.aio's wake-up reader on ``loop`` (the running loop by default); True if it
    is wrapped, now or before. Call it once grpc.aio is in use on the loop (a server started or
    a call made); once installed, a call costs two dictionary lookups."""
    loop = loop or asyncio.get_running_loop()
    if completion_reader(loop) is not None:
        return True
    reader = None if fcntl is None else _wrap(loop)
    if reader is None:
        if loop not in _UNDRAINED:
            _UNDRAINED.add(loop)
            log.info("grpc.aio's completion wake-ups are not drained: no reader of theirs here")
        return False
    _INSTALLED[loop] = reader
    return True


def _wrap(loop: asyncio.AbstractEventLoop) -> _DrainingReader | None:
    """The draining reader on ``loop``: the one there, or grpc's wrapped now (None if neither
    is registered)."""
    for fd, callback in _readers(loop):
        if isinstance(callback, _DrainingReader):
            return callback
        func = getattr(callback, "func", None)
        if getattr(func, "__qualname__", "") == _GRPC_HANDLER:
            loop.remove_reader(fd)
            reader = _DrainingReader(fd, callback)
            loop.add_reader(fd, reader)
            return reader
    return None


def _registered(loop: asyncio.AbstractEventLoop, reader: _DrainingReader) -> bool:
    """Whether ``reader`` is still ``loop``'s reader of its file descriptor."""
    selector = _selector(loop)
    key = None if selector is None else selector.get_map().get(reader.fd)
    return key is not None and _callback(key) is reader


def _readers(loop: asyncio.AbstractEventLoop) -> list[tuple[int, Callable[[], object]]]:
    """The loop's readers without arguments, by file descriptor."""
    selector = _selector(loop)
    if selector is None:
        return []
    found = []
    for key in selector.get_map().values():
        callback = _callback(key)
        if callback is not None:
            found.append((key.fd, callback))
    return found


def _selector(loop: asyncio.AbstractEventLoop) -> selectors.BaseSelector | None:
    """A selector loop's selector: the only place its readers can be read (None elsewhere)."""
    selector: selectors.BaseSelector | None = getattr(loop, "_selector", None)
    return selector


def _callback(key: selectors.SelectorKey) -> Callable[[], object] | None:
    """The reader of a registration, if it has one that takes no arguments."""
    reader = key.data[0] if isinstance(key.data, tuple) else None
    callback: Callable[[], object] | None = getattr(reader, "_callback", None)
    return callback if callback is not None and not getattr(reader, "_args", ()) else None
