"""The script engine: replays model turns from a JSONL file, with the sim engine's timing.

Each non-blank line of the file is one model turn (sampling segment)::

    {"output": [{"type": "function_call", "name": "exec_command", "arguments": {"cmd": "ls"}}]}
    {"output": [{"type": "message", "text": "All tests pass."}]}

A turn lists one or more items: ``{"type": "message", "text": str}`` or
``{"type": "function_call", "name": str, "arguments": object | str, "call_id": str}``
(``arguments`` defaults to ``{}`` and an object is serialized with ``json.dumps``;
``call_id`` is optional, and empty means the core assigns one). A line may also carry a
``"comment"``. Request ``turn_index`` ``i`` replays line ``i``, clamped to the last line.

The file is validated and tokenized when the engine is built, so a typo fails at start-up with
the file, line number and field, not in the middle of a benchmark.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import tiktoken
from bidi_responses.schema import JSONValue

from ..core.ports import EngineEvent, EngineRequest, load_encoding
from ..engine_config import EngineTiming
from .prefix_cache import PrefixCache
from .timing import (
    PlannedItem,
    play,
    token_deltas,
)

__all__ = ["ScriptEngine", "ScriptError", "ScriptItem", "load_script"]

_TURN_KEYS = frozenset({"output", "comment"})
_ITEM_KEYS: Mapping[str, frozenset[str]] = {
    "message": frozenset({"type", "text"}),
    "function_call": frozenset({"type", "name", "arguments", "call_id"}),
}


class ScriptError(ValueError):
    """The script file is missing or malformed; the message names the file, line and field."""


@dataclass(frozen=True, slots=True)
class ScriptItem:
    """One output item of a scripted turn: message text or a function call."""

    kind: Literal["message", "function_call"]
    #: Message text, or the function call's argument JSON.
    text: str
    name: str = ""
    call_id: str = ""


def load_script(path: str | os.PathLike[str]) -> list[list[ScriptItem]]:
    """Parse and validate a script file: one list of items per turn, in file order."""
    source = os.fspath(path)
    try:
        content = Path(source).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScriptError(f"script file {source!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScriptError(f"cannot read script file {source!r}: {exc}") from None

    turns: list[list[ScriptItem]] = []
    for number, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            turn = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ScriptError(f"{where}: invalid JSON: {exc}") from None
        turns.append(_parse_turn(turn, where))
    if not turns:
        raise ScriptError(f"script file {source!r} has no turns (expected one JSON line per turn)")
    return turns


def _parse_turn(turn: JSONValue, where: str) -> list[ScriptItem]:
    if not isinstance(turn, dict):
        raise ScriptError(f"{where}: a turn must be a JSON object with an 'output' list")
    unknown = sorted(set(turn) - _TURN_KEYS)
    if unknown:
        raise ScriptError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(_TURN_KEYS)}")
    output = turn.get("output")
    if not isinstance(output, list) or not output:
        raise ScriptError(f"{where}: field 'output' must be a non-empty list of items")
    return [_parse_item(item, f"{where}: output[{i}]") for i, item in enumerate(output)]


def _parse_item(item: JSONValue, where: str) -> ScriptItem:
    if not isinstance(item, dict):
        raise ScriptError(f"{where}: an item must be a JSON object")
    kind = item.get("type")
    if not isinstance(kind, str) or kind not in _ITEM_KEYS:
        raise ScriptError(
            f"{where}: field 'type' must be 'message' or 'function_call', got {kind!r}"
        )
    unknown = sorted(set(item) - _ITEM_KEYS[kind])
    if unknown:
        raise ScriptError(
            f"{where}: unknown field(s) {unknown} for a {kind}; allowed: {sorted(_ITEM_KEYS[kind])}"
        )
    if kind == "message":
        text = item.get("text")
        if not isinstance(text, str):
            raise ScriptError(f"{where}: field 'text' must be a string")
        return ScriptItem("message", text)

    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise ScriptError(f"{where}: field 'name' must be a non-empty string")
    arguments = item.get("arguments", {})
    if isinstance(arguments, dict):
        arguments = json.dumps(arguments)
    elif not isinstance(arguments, str):
        # A string is replayed verbatim, even if it is not valid JSON: that lets a script
        # exercise the API's handling of malformed arguments.
        raise ScriptError(f"{where}: field 'arguments' must be an object or a string")
    call_id = item.get("call_id", "")
    if not isinstance(call_id, str):
        raise ScriptError(f"{where}: field 'call_id' must be a string")
    return ScriptItem("function_call", arguments, name=name, call_id=call_id)


class ScriptEngine:
    """Replays a JSONL script (see the module docstring), paced like the sim engine.

    ``turn_index`` selects the line (clamped to the last). The finish reason is
    ``"tool_calls"`` if the turn contains a function call, else ``"stop"``;
    ``max_output_tokens`` truncates as in every engine. The request's tools and tool choice
    are ignored: a script says what the model does.
    """

    name: str = "script"

    def __init__(
        self,
        path: str | os.PathLike[str],
        timing: EngineTiming | None = None,
        encoding: tiktoken.Encoding | None = None,
        *,
        prefix_block_tokens: int = 64,
        prefix_cache_max_blocks: int = 65_536,
    ) -> None:
        self.path = os.fspath(path)
        self.timing = timing if timing is not None else EngineTiming()
        self.encoding = encoding if encoding is not None else load_encoding()
        self.prefix_cache = PrefixCache(prefix_block_tokens, prefix_cache_max_blocks)
        self.turns = load_script(self.path)
        # Tokenize once; encode_ordinary treats special-token text as plain text, so a script
        # can never inject control tokens into the stream.
        self._plans: list[tuple[list[PlannedItem], Literal["stop", "tool_calls"]]] = []
        for turn in self.turns:
            items = [
                PlannedItem(
                    kind=item.kind,
                    deltas=token_deltas(self.encoding, self.encoding.encode_ordinary(item.text)),
                    name=item.name,
                    call_id=item.call_id,
                )
                for item in turn
            ]
            has_call = any(item.kind == "function_call" for item in turn)
            self._plans.append((items, "tool_calls" if has_call else "stop"))

    def plan(
        self, request: EngineRequest
    ) -> tuple[list[PlannedItem], Literal["stop", "tool_calls"]]:
        """The planned items and finish reason for ``request`` (its clamped script line)."""
        return self._plans[self._turn(request)]

    def _turn(self, request: EngineRequest) -> int:
        last = len(self._plans) - 1
        return min(max(int(request.turn_index), 0), last)

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineEvent]:
        """Stream the scripted turn for ``request``; the last event is an EngineFinish."""
        index = self._turn(request)
        items, reason = self._plans[index]
        async for event in play(
            items,
            request=request,
            timing=self.timing,
            prefix_cache=self.prefix_cache,
            finish_reason=reason,
            extra={"script_turn": index},
        ):
            yield event
