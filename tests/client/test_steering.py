"""The client's steering rules without a server: which queue each message goes to, what a
``steer()`` gets back, and when a successor is known not to come."""

from __future__ import annotations

import pytest
from bidi_responses.client.steering import Route, Steering
from bidi_responses.client.types import JSONObject, ResponsesError
from bidi_responses.codec import ProtoEncoder
from bidi_responses.v1 import responses_pb2 as pb

from tests.codec.test_events import RESPONSE

_ENCODER = ProtoEncoder()


def _snapshot(
    kind: str, response_id: str, lane: str = "a", previous: str = ""
) -> pb.ConnectResponse:
    response = {**RESPONSE, "id": response_id, "previous_response_id": previous or None}
    return _ENCODER.connect_response(lane, {"type": kind, "response": response})


def _delta(lane: str = "a") -> pb.ConnectResponse:
    event: JSONObject = {
        "type": "response.output_text.delta",
        "item_id": "m",
        "output_index": 0,
        "content_index": 0,
        "delta": "x",
    }
    return _ENCODER.connect_response(lane, event)


def _accepted(target: str, steer_id: str, lane: str = "a") -> pb.ConnectResponse:
    event: JSONObject = {
        "type": "response.steer.accepted",
        "steer": {"id": steer_id, "previous_response_id": target},
    }
    return _ENCODER.connect_response(lane, event)


def _failed(target: str, code: str, steer_id: str | None = None) -> pb.ConnectResponse:
    steer: JSONObject = {"previous_response_id": target, "input": "go"}
    if steer_id is not None:
        steer["id"] = steer_id
    event: JSONObject = {
        "type": "response.steer.failed",
        "steer": steer,
        "error": {"code": code, "message": "m", "type": "invalid_request_error"},
    }
    return _ENCODER.connect_response("a", event)


def _is_lane(route: Route) -> bool:
    return route == "lane"


async def test_an_accepted_steer_routes_its_successor_apart_from_the_lane() -> None:
    steering = Steering()
    assert _is_lane(steering.route(_snapshot("response.created", "r1")))
    ack = steering.expect("r1")
    assert steering.route(_accepted("r1", "s1")) == "consumed"
    assert (await ack).accepted and (await ack).id == "s1"
    assert _is_lane(steering.route(_delta()))
    assert _is_lane(steering.route(_snapshot("response.incomplete", "r1")))
    # The successor, and everything on the lane while it runs, goes to its own queue...
    successor = steering.route(_snapshot("response.created", "r2", previous="r1"))
    assert not isinstance(successor, str)
    assert steering.route(_delta()) is successor
    # ...except a create the caller queued behind it, and other lanes.
    assert _is_lane(steering.route(_snapshot("response.queued", "r3")))
    assert _is_lane(steering.route(_delta(lane="b")))
    assert steering.route(_snapshot("response.completed", "r2", previous="r1")) is successor
    assert _is_lane(steering.route(_delta()))
    assert await steering.successor("r1") is successor


async def test_a_refused_steer_leaves_no_successor_to_wait_for() -> None:
    steering = Steering()
    steering.route(_snapshot("response.created", "r1"))
    steering.route(_snapshot("response.completed", "r1"))
    ack = steering.expect("r1")
    steering.route(_failed("r1", "response_already_completed"))
    result = await ack
    assert not result.accepted and result.code == "response_already_completed"
    assert result.input == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}
    ]
    assert await steering.successor("r1") is None


async def test_a_steer_returned_after_acceptance_ends_the_wait_for_a_successor() -> None:
    steering = Steering()
    steering.route(_snapshot("response.created", "r1"))
    ack = steering.expect("r1")
    steering.route(_accepted("r1", "s1"))
    await ack
    follows = steering.successor("r1")
    steering.route(_snapshot("response.incomplete", "r1"))
    assert not follows.done()  # accepted and not yet committed: a successor may still come
    steering.route(_failed("r1", "successor_creation_failed", steer_id="s1"))
    assert await follows is None
    outcome = steering.outcome("r1")
    assert outcome is not None and outcome["error"]["code"] == "successor_creation_failed"


async def test_a_closed_stream_ends_every_wait() -> None:
    steering = Steering()
    ack = steering.expect("r1")
    follows = steering.successor("r1")
    steering.close(ResponsesError("stream_closed", "gone"))
    with pytest.raises(ResponsesError):
        await ack
    with pytest.raises(ResponsesError):
        await follows


async def test_acknowledgements_of_steers_sent_raw_stay_on_their_lane() -> None:
    """Only ``steer()``'s own steers are tracked; one sent with ``send`` is answered on its
    lane like any event, and its successor is the lane's too."""
    steering = Steering()
    steering.route(_snapshot("response.created", "r1"))
    assert _is_lane(steering.route(_accepted("r1", "s1")))
    assert _is_lane(steering.route(_snapshot("response.incomplete", "r1")))
    assert _is_lane(steering.route(_snapshot("response.created", "r2", previous="r1")))
    assert _is_lane(steering.route(_delta()))
