"""Handing freed memory back to the operating system once the server goes idle.

A burst of streams grows the heap; when they close, Python frees their objects but glibc
keeps the freed pages (per-thread arenas are not trimmed on their own), so the process's RSS
stays at its peak. After the last stream closes and the server has stayed idle for a moment,
a full collection and ``malloc_trim(0)`` return what is free. It runs only when idle, never
between turns of a busy server.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


def _load_malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    result: Callable[[int], int] = trim
    return result


_MALLOC_TRIM = _load_malloc_trim()


class IdleTrimmer:
    """Trims the heap ``delay_s`` after the server became idle (if it still is)."""

    def __init__(self, delay_s: float, enabled: bool = True) -> None:
        self._delay_s = delay_s
        self._enabled = enabled and _MALLOC_TRIM is not None
        self._pending: asyncio.TimerHandle | None = None
        self.trims = 0
        self.trimmed = asyncio.Event()  # set at every trim (for whoever waits for one)

    def busy(self) -> None:
        """Work arrived: a scheduled trim is no longer wanted."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None

    def idle(self, still_idle: Callable[[], bool]) -> None:
        """The server just went idle: trim after the delay if ``still_idle()`` then."""
        if not self._enabled:
            return
        self.busy()

        def fire() -> None:
            self._pending = None
            if still_idle():
                self.trim()

        self._pending = asyncio.get_running_loop().call_later(self._delay_s, fire)

    def trim(self) -> None:
        """Collect, then hand free heap pages back to the OS."""
        gc.collect()
        if _MALLOC_TRIM is not None:
            _MALLOC_TRIM(0)
            self.trims += 1
            self.trimmed.set()
