"""The shapes the report passes around: JSON-like rows and the targets' verdicts."""

from __future__ import annotations

from typing import TypedDict

from ..jsontypes import JSONObject, JSONValue

__all__ = ["JSONObject", "JSONValue", "Target"]


class Target(TypedDict):
    """One target of the comparison, judged on one run (``met`` None: not measured)."""

    id: str
    target: str
    measured: float | None
    met: bool | None
    detail: str
