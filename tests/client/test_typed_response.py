"""The client's ``Response`` is typed with the server's own item types: a type checker sees
``output`` as the ``Item`` union, narrows it by ``["type"]``, and refuses a field an item does
not have. Checked by running mypy over a snippet of client code; a runtime check alongside, so
the types describe what a decoded Response holds."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

from bidi_responses.client import FunctionCallItem, Item, Response
from bidi_responses.codec import ProtoEncoder, response_to_dict
from mypy import api

from tests.codec.test_events import RESPONSE

SNIPPET = """
from bidi_responses.client import Response


def read(response: Response) -> None:
    reveal_type(response.output[0])
    reveal_type(response.function_calls[0])
    reveal_type(response.pending_calls[0])
    reveal_type(response.call_output("ok"))
    reveal_type(response.error)
    item = response.output[0]
    if item["type"] == "function_call":
        reveal_type(item)
        item["arguments"].upper()
    response.function_calls[0]["content"]
    response.output[0]["call_id"]
"""


def _type_check(tmp_path: Path) -> tuple[list[str], list[str]]:
    """mypy --strict over the snippet: the revealed types and the errors, in order."""
    path = tmp_path / "snippet.py"
    path.write_text(SNIPPET)
    stdout, stderr, _ = api.run(
        ["--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache"), str(path)]
    )
    assert not stderr, stderr
    revealed = re.findall(r'note: Revealed type is "(.*)"', stdout)
    errors = re.findall(r"error: (.*)", stdout)
    return revealed, errors


def _names(revealed: str) -> set[str]:
    """The class names of a revealed type's members (one type or a union), as mypy writes
    them: ``A | TypedDict(pkg.B, {...}) | None``."""
    members, depth, start = [], 0, 0
    for index, char in enumerate(revealed):
        depth += char in "([{"
        depth -= char in ")]}"
        if depth == 0 and revealed.startswith(" | ", index):
            members.append(revealed[start:index])
            start = index + 3
    members.append(revealed[start:])
    names = set()
    for member in members:
        if member.startswith("TypedDict("):
            member = member.removeprefix("TypedDict(").split(",", 1)[0]
        names.add(member.rsplit(".", 1)[-1])
    return names


def test_a_type_checker_sees_the_response_typed(tmp_path: Path) -> None:
    revealed, errors = _type_check(tmp_path)
    output, function_call, pending_call, call_output, error, narrowed = revealed
    item_kinds = {kind.__name__ for kind in get_args(Item)}
    assert len(item_kinds) >= 8
    assert _names(output) == item_kinds
    assert _names(function_call) == _names(pending_call) == _names(narrowed) == {"FunctionCallItem"}
    assert _names(call_output) == {"FunctionCallOutputItem"}
    assert _names(error) == {"ResponseError", "None"}
    # A field the item does not have is an error; on the union, for every kind without it.
    assert errors[0] == 'TypedDict "FunctionCallItem" has no key "content"  [typeddict-item]'
    missing_call_id = {m for e in errors[1:] for m in re.findall(r'TypedDict "(\w+)" has no', e)}
    assert missing_call_id == item_kinds - {
        "FunctionCallItem",
        "FunctionCallOutputItem",
        "CustomToolCallItem",
        "CustomToolCallOutputItem",
    }


def test_a_decoded_response_holds_what_its_types_say() -> None:
    call: FunctionCallItem = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "exec_command",
        "arguments": "{}",
        "id": "fc_1",
        "status": "completed",
    }
    message = {
        "type": "message",
        "role": "assistant",
        "id": "msg_1",
        "status": "completed",
        "content": [{"type": "output_text", "text": "done", "annotations": []}],
    }
    raw = {**RESPONSE, "output": [message, call]}
    response = Response.from_dict(response_to_dict(ProtoEncoder().response_to_pb(raw)))
    assert response.output == [message, call]
    assert response.function_calls == [call]
    assert response.output_text == "done"
    assert response.call_output("ok") == {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": "ok",
    }
