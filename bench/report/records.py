"""The shapes the report passes around: JSON-like rows and the targets' verdicts."""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = ["JSONObject", "JSONValue", "Target"]

#: A value of the results file. Summaries and raw runs are free JSON: their rows carry a
#: column per figure, per pipeline stage and per sweep parameter, so their values are ``Any``.
JSONValue = Any
#: One row or object of the results file (a summary, a summary row, a run, a turn).
JSONObject = dict[str, JSONValue]


class Target(TypedDict):
    """One target of the comparison, judged on one run (``met`` None: not measured)."""

    id: str
    target: str
    measured: float | None
    met: bool | None
    detail: str
