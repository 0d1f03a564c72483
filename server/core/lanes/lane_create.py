"""A create on a stream's lane, typed when it arrives: the request the lane machine queues.

The create is checked against its lane (the lane's tools are known when it arrives), so an
invalid one is refused at once, even behind a busy lane. Its automatic successor (after a
steer) is the same request continued with the steering input.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import cast

from bidi_responses.schema import Item, JSONObject

from ..api.requests import CreateRequest


@dataclass(frozen=True, slots=True)
class LaneCreate:
    """A checked create and what its run is given besides: the client event it answers
    (``event_id``; None: a successor, which answers none) and when it arrived (None: a
    successor, timed when it starts)."""

    request: CreateRequest
    event_id: str | None
    received: float | None

    @property
    def previous_response_id(self) -> str | None:
        return self.request.previous_response_id

    def successor(self, response_id: str, steering: list[JSONObject]) -> LaneCreate:
        """The automatic successor of ``response_id``: this request's settings, continuing
        it with ``steering`` as its input; no retry key of its own, and it answers no client
        event."""
        request = replace(
            self.request,
            input=cast(list[Item], steering),
            previous_response_id=response_id,
            idempotency_key=None,
            generate=True,
        )
        return LaneCreate(request, None, None)
