"""Output format, reasoning, usage and stats, both ways."""

from __future__ import annotations

from bidi_responses.codec import (
    JSONObject,
    reasoning_to_dict,
    reasoning_to_pb,
    stats_to_dict,
    stats_to_pb,
    text_to_dict,
    text_to_pb,
    usage_to_dict,
    usage_to_pb,
)
from bidi_responses.v1 import responses_pb2 as pb


def test_json_schema_format_round_trip_with_integers_back() -> None:
    text: JSONObject = {
        "format": {
            "type": "json_schema",
            "name": "answer",
            "schema": {"type": "object", "maxProperties": 2},
            "description": "The answer.",
            "strict": True,
        },
        "verbosity": "low",
    }
    decoded = text_to_dict(text_to_pb(text))
    assert decoded == text
    assert type(decoded["format"]["schema"]["maxProperties"]) is int


def test_text_defaults_are_echoed() -> None:
    assert text_to_dict(pb.TextConfig()) == {"format": {"type": "text"}}
    schema_free = text_to_dict(text_to_pb({"format": {"type": "json_schema", "schema": {}}}))
    assert schema_free == {"format": {"type": "json_schema", "strict": None}}


def test_reasoning_round_trip() -> None:
    for reasoning in ({"effort": "low", "summary": "auto"}, {"effort": None, "summary": None}):
        assert reasoning_to_dict(reasoning_to_pb(reasoning)) == reasoning


def test_usage_round_trip() -> None:
    usage: JSONObject = {
        "input_tokens": 120,
        "input_tokens_details": {"cached_tokens": 100},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 127,
    }
    assert usage_to_dict(usage_to_pb(usage)) == usage


def test_stats_round_trip_keeps_native_numbers_and_maps() -> None:
    stats = stats_to_dict(pb.ResponseStats())
    stats.update(
        items_validated=3,
        tokens_rendered=40,
        engine_ms=1.5,
        route_resolved=True,
        stage_items={"safety": 2},
        stage_ms={"safety": 0.25},
    )
    assert stats_to_dict(stats_to_pb(stats)) == stats
