"""Names for the free JSON the benchmarks pass around (events, request bodies, result rows):
Responses API events and bodies as the wire carries them, and the rows of the results file,
whose columns vary with the sweep, the stages and the server's counters. The same aliases as
the client's and the codec's."""

from __future__ import annotations

from bidi_responses.client.types import JSONObject, JSONValue

__all__ = ["JSONObject", "JSONValue"]
