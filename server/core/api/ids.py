"""Identifiers in the Responses style: a type prefix and 32 random hex digits."""

from __future__ import annotations

import os
from collections.abc import Iterable

from bidi_responses.schema import Item

# The id prefix of each item kind the server names.
_ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "compaction": "cmp",
}


def new_id(prefix: str) -> str:
    """A fresh id such as ``resp_9f2c...``; ``prefix`` is ``resp``, ``msg``, ``fc``, ``call``..."""
    return f"{prefix}_{os.urandom(16).hex()}"


def assign_ids(items: Iterable[Item]) -> None:
    """Give each item that has no id one with its kind's prefix."""
    for item in items:
        if "id" not in item:
            item["id"] = new_id(_ID_PREFIX.get(item["type"], "item"))
