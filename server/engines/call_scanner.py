"""One tool call's JSON, read while the model writes it: the function's name first, then its
arguments as deltas, character by character (key order and spacing kept), then a check of the
whole call.

``tool_calls`` finds where calls begin and end in the model's output; this module reads what
is between. A call that cannot be read fails the response with ``engine_bad_response``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from ..core.ports import Delta, EngineError, EngineEvent, ItemStart

__all__ = ["CallScanner", "call_events", "malformed"]

# A call's head, up to where its arguments begin.
_HEAD = re.compile(
    r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\S)',
    re.S,
)
_MAX_CALL_CHARS = 1 << 20


def malformed(detail: str) -> EngineError:
    """The model wrote a tool call that cannot be read."""
    return EngineError("engine_bad_response", f"The model wrote a malformed tool call: {detail}")


@dataclass(slots=True)
class CallScanner:
    """One tool call's JSON, read as it streams: the name first, then the arguments as
    deltas, then a check of the whole."""

    body: str = ""
    name: str | None = None
    # Where the arguments value starts in ``body``, and how far it has been streamed.
    start: int = -1
    sent: int = 0
    # The JSON scanner's state over the arguments value.
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    done_at: int = -1
    streaming: bool = False
    events: list[EngineEvent] = field(default_factory=list)

    def feed(self, text: str) -> list[EngineEvent]:
        """More of the call's text; returns the item start and argument deltas it allows."""
        self.body += text
        if len(self.body) > _MAX_CALL_CHARS:
            raise malformed("it is longer than 1 MiB")
        events: list[EngineEvent] = []
        if self.name is None:
            head = _HEAD.match(self.body)
            if head is None:
                return events
            try:
                self.name = json.loads(f'"{head.group(1)}"')
            except ValueError:
                raise malformed("its name is not a JSON string") from None
            self.start = self.sent = head.end()
            self.streaming = self.body[self.start] == "{"
            events.append(ItemStart("function_call", name=self.name or ""))
        if self.streaming and self.done_at < 0:
            events += self._scan()
        return events

    def _scan(self) -> list[EngineEvent]:
        body = self.body
        index = self.sent
        while index < len(body):
            char = body[index]
            index += 1
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.done_at = index
                    break
        piece = body[self.sent : index]
        self.sent = index
        return [Delta(piece, ())] if piece else []

    def finish(self) -> tuple[list[EngineEvent], str]:
        """The call's text is complete: check it and return the events still owed (the whole
        call when its arguments could not stream) and the arguments JSON."""
        try:
            value = json.loads(self.body)
        except ValueError as exc:
            raise malformed(f"it is not JSON ({exc}): {self.body[:200]!r}") from None
        events, text = call_events(value, self.name is None)
        if self.name is not None and not self.streaming:
            events = [Delta(text, ())]  # announced, but its arguments could not stream
        return events, text


def call_events(value: object, announce: bool) -> tuple[list[EngineEvent], str]:
    """A whole call's events (its item start when ``announce``, then its arguments as one
    delta) and its arguments JSON; ``malformed`` when it has no name or no object arguments."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise malformed("it has no 'name'")
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        text = arguments
        try:
            arguments = json.loads(text) if text else {}
        except ValueError:
            raise malformed("its arguments are not JSON") from None
    if not isinstance(arguments, dict):
        raise malformed("its arguments are not a JSON object")
    text = json.dumps(arguments, ensure_ascii=False)
    if not announce:
        return [], text
    return [ItemStart("function_call", name=value["name"]), Delta(text, ())], text
