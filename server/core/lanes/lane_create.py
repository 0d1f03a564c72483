"""A create on a stream's lane, typed when it arrives: the request the lane machine queues.

The create is checked against its lane (the lane's tools are known when it arrives), so an
invalid one is refused at once, even behind a busy lane. Its automatic successor (after a
steer) is the same request continued with the steering input.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import cast

from bidi_responses.schema import Item, JSONObject, JSONValue

from ..api.requests import CreateRequest

# Settings an automatic successor does not take from the response it continues: its own
# input, parent and retry key, and the client's event id (it answers no client event).
_NOT_INHERITED = ("input", "previous_response_id", "idempotency_key", "generate", "event_id")


@dataclass(frozen=True, slots=True)
class LaneCreate:
    """A checked create and what its run is given: ``body`` (the run checks the body as
    sent, ``runs.runner.ResponseRun``) and when it arrived (None: a successor, timed when it
    starts)."""

    request: CreateRequest
    body: JSONObject
    received: float | None

    @property
    def previous_response_id(self) -> str | None:
        return self.request.previous_response_id

    def successor(self, response_id: str, steering: list[JSONObject]) -> LaneCreate:
        """The automatic successor of ``response_id``: this request's settings, continuing
        it with ``steering`` as its input."""
        request = replace(
            self.request,
            input=cast(list[Item], steering),
            previous_response_id=response_id,
            idempotency_key=None,
            generate=True,
        )
        body = {key: value for key, value in self.body.items() if key not in _NOT_INHERITED}
        body["previous_response_id"] = response_id
        body["input"] = cast(JSONValue, steering)
        return LaneCreate(request, body, None)
