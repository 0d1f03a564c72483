"""Log lines that a client can cause, rate-limited per kind.

A hostile client decides how often an undecodable message, a refused connection or a failed
``accept()`` happens; logging each one hands it the disk (686,000 lines in 90 s from one
descriptor flood). Each kind of line gets ``per_minute`` lines per minute; the rest are
counted, and the next line of that kind says how many were left out. The counts are also on
``/metrics`` (``bidi_log_lines_suppressed_total``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

_WINDOW_S = 60.0


class LogLimiter:
    """Up to ``per_minute`` lines per kind in any fixed minute-long window (0 = no limit).

    Thread-safe enough for its purpose: a race can let one extra line through, never lose
    the count of the suppressed ones for good.
    """

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self._clock = clock
        # kind -> [window start, lines written in it, lines suppressed since the last one]
        self._windows: dict[str, list[float]] = {}
        #: Lines suppressed so far, by kind (for the metric).
        self.suppressed: dict[str, int] = {}

    def configure(self, per_minute: int) -> None:
        """Set the rate and start every kind's allowance afresh (a server starting)."""
        self.per_minute = per_minute
        self._windows.clear()

    def allow(self, kind: str) -> int | None:
        """None: leave this line out. Otherwise write it, and say that this many lines of
        the kind were left out before it."""
        if self.per_minute <= 0:
            return 0
        now = self._clock()
        window = self._windows.get(kind)
        if window is None or now - window[0] >= _WINDOW_S:
            window = [now, 0.0, window[2] if window is not None else 0.0]
            self._windows[kind] = window
        if window[1] >= self.per_minute:
            window[2] += 1
            self.suppressed[kind] = self.suppressed.get(kind, 0) + 1
            return None
        window[1] += 1
        left_out, window[2] = int(window[2]), 0.0
        return left_out

    def log(
        self,
        logger: logging.Logger,
        level: int,
        kind: str,
        msg: str,
        *args: object,
        exc_info: BaseException | None = None,
    ) -> None:
        """``logger.log(level, msg, *args)`` within the kind's allowance."""
        if not logger.isEnabledFor(level):
            return
        left_out = self.allow(kind)
        if left_out is None:
            return
        if left_out:
            msg += " (%d more like this left out)"
            args = (*args, left_out)
        logger.log(level, msg, *args, exc_info=exc_info)


class RateLimitFilter(logging.Filter):
    """For a logger this project does not own (asyncio's, uvicorn's): records that ``kind_of``
    names a kind are held to ``limiter``; the others pass."""

    def __init__(self, limiter: LogLimiter, kind_of: Callable[[logging.LogRecord], str | None]):
        super().__init__()
        self._limiter = limiter
        self._kind_of = kind_of

    def filter(self, record: logging.LogRecord) -> bool:
        kind = self._kind_of(record)
        if kind is None:
            return True
        left_out = self._limiter.allow(kind)
        if left_out is None:
            return False
        if left_out:
            record.msg = f"{record.getMessage()} ({left_out} more like this left out)"
            record.args = ()
        return True


#: The process's limiter for lines about client faults; ``serve`` sets its rate from
#: ``limits.client_fault_log_lines_per_minute``.
CLIENT_FAULTS = LogLimiter(10)


class SuppressedLines(Collector):
    """``bidi_log_lines_suppressed_total`` by kind, read from ``CLIENT_FAULTS`` when scraped."""

    def describe(self) -> list[CounterMetricFamily]:
        return []

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "bidi_log_lines_suppressed",
            "Log lines about client faults left out by the rate limit, by kind.",
            labels=["kind"],
        )
        for kind, count in sorted(CLIENT_FAULTS.suppressed.items()):
            family.add_metric([kind], count)
        yield family
