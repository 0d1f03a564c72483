"""A lane: one conversation within a stream, and what it keeps between its responses.

A Connect stream carries several lanes; a WebSocket connection is one lane; a stateless HTTP
call gets a throwaway lane without a cache. What a lane keeps is what makes the next turn cheap:
the cached conversation state (in ``cache``), the last request's ``ToolSet`` and resolved route,
and what the engine keeps for it (an upstream connection).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bidi_responses.server.core.state import ResponseCache
from bidi_responses.server.core.tools import ToolSet
from bidi_responses.server.engines.base import EngineAffinity
from bidi_responses.server.pipeline.routing import Route

if TYPE_CHECKING:
    from bidi_responses.server.core.runner import ResponseRun


class Lane:
    """One conversation lane of a stream: its cache, the tool set and route it
    reuses between turns, and its in-flight response."""

    def __init__(self, lane_id: str, cache: ResponseCache | None) -> None:
        self.id = lane_id
        self.cache = cache
        self.inflight: ResponseRun | None = None
        # The last request's tools, reused while the client sends the same list.
        self.toolset: ToolSet | None = None
        self.route_memo: tuple[Any, Route] | None = None
        # Set when the client has said it will send nothing more (half-close): a response
        # that would wait for tool outputs ends at once instead.
        self.input_closed = False
        # What engines keep for this lane between turns (an upstream connection).
        self.affinity = EngineAffinity()

    @property
    def stateful(self) -> bool:
        """True on Connect and WebSocket lanes; False for one-shot stateless calls."""
        return self.cache is not None
