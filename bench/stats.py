"""Order statistics of the benchmarks' figures: percentile, and a median and mean that skip gaps."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

__all__ = ["mean", "median", "percentile"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linear between closest ranks; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (pos - low))


def median(values: Iterable[float]) -> float:
    data = [v for v in values if v is not None and not math.isnan(v)]
    return float(statistics.median(data)) if data else math.nan


def mean(values: Iterable[float]) -> float:
    data = [v for v in values if v is not None]
    return float(sum(data) / len(data)) if data else math.nan
