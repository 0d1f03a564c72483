"""A lane: one conversation within a stream, and what it keeps between its responses.

A Connect stream carries several lanes; a WebSocket connection is one lane; a stateless HTTP
call gets a throwaway lane without a cache. What a lane keeps is what makes the next turn cheap:
the cached conversation state (in ``cache``), the last request's ``ToolSet`` and resolved route,
and what the engine keeps for it (an upstream connection).
"""

from __future__ import annotations

from bidi_responses.schema import JSONObject

from ...config import Limits
from ..api.errors import ApiError
from ..api.requests import CreateRequest, parse_create
from ..api.tools import ToolSet
from ..conversation.state import ResponseCache
from ..ports import EngineAffinity
from .routing import Route, Router


class Lane:
    """One conversation lane of a stream: its cache, the tool set and route it
    reuses between turns, and its in-flight response."""

    def __init__(self, lane_id: str, cache: ResponseCache | None) -> None:
        self.id = lane_id
        self.cache = cache
        # The response running on the lane (a ``ResponseRun``), None while it is free; only
        # compared and cleared here, so the lane need not know the run's type.
        self.inflight: object | None = None
        # The last request's tools, reused while the client sends the same list.
        self.toolset: ToolSet | None = None
        # (the router's key for the model, its route)
        self.route_memo: tuple[tuple[str, int], Route] | None = None
        # Set when the client has said it will send nothing more (half-close): a response
        # that would wait for tool outputs ends at once instead.
        self.input_closed = False
        # What engines keep for this lane between turns (an upstream connection).
        self.affinity = EngineAffinity()

    @property
    def stateful(self) -> bool:
        """True on Connect and WebSocket lanes; False for one-shot stateless calls."""
        return self.cache is not None

    def parse(self, body: JSONObject, limits: Limits) -> CreateRequest:
        """Check a create body for this lane; ApiError naming the field it cannot take."""
        # The lane's last tool set is reused while the client sends the same tools.
        request = parse_create(body, limits, self.toolset)
        if self.stateful:
            self.toolset = request.toolset
        if request.background and self.stateful:
            # As in the hosted WebSocket mode: a connection's responses are its own turns.
            raise ApiError(
                "Unsupported parameter: 'background': not available on a WebSocket or Connect "
                "stream; use POST /v1/responses.",
                code="unsupported_parameter",
                param="background",
            )
        if request.background and not request.store:
            raise ApiError(
                "Invalid 'background': background mode requires 'store': true.",
                code="invalid_value",
                param="background",
            )
        if request.append_mode and not self.stateful:
            raise ApiError(
                "'append_mode' needs a Connect stream or a WebSocket connection.",
                code="unsupported_parameter",
                param="append_mode",
            )
        return request

    def route(self, router: Router, model: str) -> tuple[Route, bool]:
        """The model's route, and whether it was resolved now (False: the lane's last one)."""
        key = router.route_key(model)
        memo = self.route_memo
        if memo is not None and memo[0] == key:
            return memo[1], False
        route = router.resolve(model)
        if self.stateful:
            self.route_memo = (key, route)
        return route, True
