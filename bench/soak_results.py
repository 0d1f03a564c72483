"""What a soak measured: each agent's turns, each transport's burst, and their summary table.

Apart from the load (``soak``) so the figures a soak reports, and how they are counted, read
on their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .jsontypes import JSONObject
from .stats import percentile

__all__ = ["AgentResult", "TransportResult", "format_table"]


@dataclass(slots=True)
class AgentResult:
    """What one agent saw."""

    turn_ms: list[float] = field(default_factory=list)
    # Of each turn: the server's own pre-inference time (from reading the request to the
    # engine's start) and the time the server did not account for (the transport both ways,
    # and waiting to be read at all).
    pre_ms: list[float] = field(default_factory=list)
    outside_ms: list[float] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    failed: int = 0
    lost: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass(slots=True)
class TransportResult:
    """One transport's soak."""

    transport: str
    agents: int
    turns: int
    seconds: float
    results: list[AgentResult]
    ledger_rows: int
    rss_before: int
    rss_peak: int
    rss_after: int
    # Streams opened while the load ran (a new connection each): from the open to the first
    # event of their first create.
    late_open_ms: list[float] = field(default_factory=list)

    def summary(self) -> JSONObject:
        """The figures the table shows."""
        ids = [i for r in self.results for i in r.ids]
        first = [r.turn_ms[0] for r in self.results if r.turn_ms]
        later = [t for r in self.results for t in r.turn_ms[1:]]
        every = first + later
        expected = self.agents * self.turns
        return {
            "transport": self.transport,
            "responses": len(ids),
            "expected": expected,
            # A turn that never got its terminal event within the deadline.
            "lost": sum(r.lost for r in self.results),
            "duplicated": len(ids) - len(set(ids)) + max(self.ledger_rows - expected, 0),
            "failed": sum(r.failed for r in self.results),
            "ledger_rows": self.ledger_rows,
            "p50_ms": _pct(every, 50),
            "p99_ms": _pct(every, 99),
            "first_p99_ms": _pct(first, 99),
            "later_p99_ms": _pct(later, 99),
            "first_pre_p99_ms": _pct([r.pre_ms[0] for r in self.results if r.pre_ms], 99),
            "first_outside_p99_ms": _pct(
                [r.outside_ms[0] for r in self.results if r.outside_ms], 99
            ),
            "later_pre_p99_ms": _pct([t for r in self.results for t in r.pre_ms[1:]], 99),
            "later_outside_p99_ms": _pct([t for r in self.results for t in r.outside_ms[1:]], 99),
            "late_opens": len(self.late_open_ms),
            "late_open_p99_ms": _pct(self.late_open_ms, 99),
            "late_open_max_ms": max(self.late_open_ms, default=0.0),
            "seconds": self.seconds,
            "rss_before_mb": self.rss_before / 2**20,
            "rss_peak_mb": self.rss_peak / 2**20,
            "rss_after_mb": self.rss_after / 2**20,
            "rss_after_pct": 100.0 * (self.rss_after - self.rss_before) / max(self.rss_before, 1),
            "errors": sorted({e for r in self.results for e in r.errors})[:5],
        }


def format_table(summaries: Sequence[JSONObject]) -> str:
    """The soak's summary table."""
    header = (
        f"{'transport':<10}{'responses':>10}{'ledger':>8}{'lost':>6}{'dup':>5}{'failed':>7}"
        f"{'p50 ms':>9}{'p99 ms':>9}{'1st p99':>9}{'rest p99':>9}{'secs':>7}"
        f"{'RSS MB before':>15}{'peak':>8}{'after':>8}{'after %':>9}"
        f"{'1st pre p99':>13}{'1st outside p99':>17}{'rest pre p99':>14}{'rest outside':>14}"
        f"{'late opens':>12}{'open p99':>10}{'open max':>10}"
    )
    lines = [header]
    for s in summaries:
        lines.append(
            f"{s['transport']:<10}{s['responses']:>10}{s['ledger_rows']:>8}{s['lost']:>6}"
            f"{s['duplicated']:>5}"
            f"{s['failed']:>7}{s['p50_ms']:>9.1f}{s['p99_ms']:>9.1f}{s['first_p99_ms']:>9.1f}"
            f"{s['later_p99_ms']:>9.1f}{s['seconds']:>7.1f}{s['rss_before_mb']:>15.1f}"
            f"{s['rss_peak_mb']:>8.1f}{s['rss_after_mb']:>8.1f}{s['rss_after_pct']:>+9.1f}"
            f"{s['first_pre_p99_ms']:>13.1f}{s['first_outside_p99_ms']:>17.1f}"
            f"{s['later_pre_p99_ms']:>14.1f}{s['later_outside_p99_ms']:>14.1f}"
            f"{s['late_opens']:>12}{s['late_open_p99_ms']:>10.1f}{s['late_open_max_ms']:>10.1f}"
        )
    return "\n".join(lines)


def _pct(values: Sequence[float], pct: float) -> float:
    """A percentile, 0 rather than NaN for an empty list: a row with no turns of a kind prints 0."""
    return percentile(values, pct) if values else 0.0
