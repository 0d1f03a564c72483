"""A text table and its cells: every table of the report formats numbers the same way."""

from __future__ import annotations

import math
from typing import NamedTuple

from .records import JSONObject, JSONValue

__all__ = ["Table", "aligned", "fmt", "kb", "repeat_range", "spread"]


class Table(NamedTuple):
    """One table: its title, column headers and rows, every cell already text."""

    title: str
    header: list[str]
    rows: list[list[str]]


def fmt(value: JSONValue, digits: int = 1) -> str:
    """A figure as text: ``-`` for a missing one or NaN, floats to ``digits`` places."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def spread(value: JSONValue, low_high: JSONValue, digits: int = 1) -> str:
    """``value [low-high]``: a median and its range over repeats (just the value without one)."""
    text = fmt(value, digits)
    if isinstance(low_high, list) and len(low_high) == 2 and low_high[0] != low_high[1]:
        text += f" [{fmt(low_high[0], digits)}-{fmt(low_high[1], digits)}]"
    return text


def repeat_range(row: JSONObject) -> list[float] | None:
    """The range of the per-repeat median overheads of a row (None with fewer than 2)."""
    medians = row.get("overhead_repeat_medians_ms") or []
    return [min(medians), max(medians)] if len(medians) > 1 else None


def kb(value: float | None) -> str:
    """Bytes as KiB with one decimal (``-`` when missing)."""
    return "-" if value is None or math.isnan(value) else f"{value / 1024:.1f}"


def aligned(header: list[str], rows: list[list[str]]) -> str:
    """A table as columns padded to their widest cell, for the terminal."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    return "\n".join(lines)
