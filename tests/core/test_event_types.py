"""The typed domain's helpers: which events carry a Response, terminal events, part text."""

from __future__ import annotations

from typing import cast

import pytest
from bidi_responses.schema import (
    ContentPart,
    ErrorObject,
    Outcome,
    ResponseObject,
    ServerEvent,
    part_text,
    snapshot_of,
    terminal_response,
)
from bidi_responses.server.core.runs.record import error_event, terminal_event

# Only its identity matters here.
RESPONSE = cast(ResponseObject, {"id": "resp_1", "object": "response"})


@pytest.mark.parametrize(
    ("outcome", "kind"),
    [
        ("completed", "response.completed"),
        ("incomplete", "response.incomplete"),
        ("failed", "response.failed"),
    ],
)
def test_terminal_event_names_the_outcome(outcome: Outcome, kind: str) -> None:
    event = terminal_event(outcome, RESPONSE, 7)
    assert event == {"type": kind, "response": RESPONSE, "sequence_number": 7}
    assert terminal_response(event) is RESPONSE
    assert snapshot_of(event) is RESPONSE


def test_only_lifecycle_events_carry_a_response() -> None:
    created: ServerEvent = {"type": "response.created", "response": RESPONSE, "sequence_number": 0}
    delta: ServerEvent = {
        "type": "response.output_text.delta",
        "item_id": "msg_1",
        "output_index": 0,
        "content_index": 0,
        "delta": "hi",
        "sequence_number": 1,
    }
    error = error_event(400, {"type": "t", "code": "c", "message": "m", "param": None})
    assert snapshot_of(created) is RESPONSE and terminal_response(created) is None
    assert snapshot_of(delta) is None and terminal_response(delta) is None
    assert snapshot_of(error) is None and terminal_response(error) is None


def test_error_event_says_what_it_answers_in_a_fixed_order() -> None:
    error: ErrorObject = {
        "type": "invalid_request_error",
        "code": "not_found",
        "message": "m",
        "param": None,
    }
    answers = {"response_id": "resp_1", "event_id": "", "request_type": "cancel", "x": "y"}
    event = error_event(404, error, answers)
    assert event["status"] == 404
    # Empty and unknown answers are left out, and the error object given is not changed.
    keys = ["type", "code", "message", "param", "request_type", "response_id"]
    assert list(event["error"]) == keys
    assert "request_type" not in error


@pytest.mark.parametrize(
    ("part", "text"),
    [
        ({"type": "input_text", "text": "a"}, "a"),
        ({"type": "output_text", "text": "b", "annotations": []}, "b"),
        ({"type": "refusal", "refusal": "no"}, "no"),
        ({"type": "input_image", "image_url": "https://x/y.png", "detail": "auto"}, "[image]"),
    ],
)
def test_part_text(part: ContentPart, text: str) -> None:
    assert part_text(part) == text
