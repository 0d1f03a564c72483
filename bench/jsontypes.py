"""Names for the free JSON the benchmarks pass around (events, request bodies, result rows)."""

from __future__ import annotations

from typing import Any

__all__ = ["JSONObject", "JSONValue"]

#: Any JSON value: Responses API events and bodies as the wire carries them, and the rows of
#: the results file, whose columns vary with the sweep, the stages and the server's counters.
JSONValue = Any
#: A JSON object.
JSONObject = dict[str, JSONValue]
