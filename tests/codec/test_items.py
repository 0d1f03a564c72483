"""Items and content parts: every kind survives JSON -> protobuf -> JSON."""

from __future__ import annotations

import pytest
from bidi_responses.codec import JSONObject, canonical_item, item_to_dict, item_to_pb
from bidi_responses.v1 import responses_pb2 as pb

ITEMS: list[JSONObject] = [
    {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "data:image/png;base64,AA==", "detail": "low"},
        ],
        "id": "msg_1",
        "status": "completed",
    },
    {
        "type": "message",
        "role": "assistant",
        "content": [
            {"type": "output_text", "text": "done", "annotations": [{"type": "note", "n": 1.0}]},
            {"type": "refusal", "refusal": "no"},
        ],
        "phase": "final_answer",
    },
    {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{}", "id": "fc_1"},
    {"type": "function_call_output", "call_id": "c1", "output": "ok", "status": "completed"},
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}], "id": "rs_1"},
    {"type": "reasoning", "summary": [], "encrypted_content": "sealed"},
    {"type": "compaction", "encrypted_content": "sealed", "id": "cmp_1", "created_by": "server"},
    {"type": "custom_tool_call", "call_id": "c2", "name": "patch", "input": "diff"},
]


@pytest.mark.parametrize("item", ITEMS, ids=lambda item: str(item["type"]))
def test_item_round_trip(item: JSONObject) -> None:
    assert item_to_dict(item_to_pb(item)) == item


def test_an_image_without_detail_reads_back_as_auto() -> None:
    item = {"type": "message", "role": "user", "content": [{"type": "input_image"}]}
    part = item_to_dict(item_to_pb(item))["content"][0]
    assert part == {"type": "input_image", "image_url": "", "detail": "auto"}


def test_unset_oneofs_decode_as_empty_objects_for_the_core_to_refuse() -> None:
    assert item_to_dict(pb.Item()) == {}
    message = pb.Item(message=pb.MessageItem(role="user", content=[pb.ContentPart()]))
    assert item_to_dict(message)["content"] == [{}]


def test_shorthand_items_are_filled_in() -> None:
    assert canonical_item({"role": "user", "content": "hi"}) == {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "hi"}],
    }
    assert canonical_item({"role": "assistant", "content": "yes"})["content"] == [
        {"type": "output_text", "text": "yes"}
    ]
    item: JSONObject = {"type": "function_call_output", "call_id": "c", "output": "x"}
    assert canonical_item(item) is item
