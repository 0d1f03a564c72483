"""What an open model samples, parsed into items while it streams: text, tool calls in the
model's own format, and reasoning.

The template teaches the model how to call a tool; the parser reads the same format back:

* ``tags``: JSON in tags, as Qwen, Hermes and many fine-tunes write it::

      <tool_call>
      {"name": "get_weather", "arguments": {"city": "Paris"}}
      </tool_call>

* ``json``: a bare JSON object as the whole answer, as Llama 3.x writes it::

      {"name": "get_weather", "parameters": {"city": "Paris"}}

  (also a JSON list of such objects, or several separated by ``;``).

A call's ``arguments`` (or ``parameters``) stream as argument deltas once its ``name`` has
been read, character by character as the model writes them (key order and spacing kept).
Text outside calls is a message; ``<think>...</think>`` (when the template uses it) is
reasoning. A call the model leaves malformed (not JSON, no name, arguments that are not an
object) fails the response with ``engine_bad_response``, naming what was wrong; a call cut
short by the output budget ends the response ``incomplete``, like any truncated item.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from ..core.ports import Delta, EngineError, EngineEvent, ItemEnd, ItemStart
from .call_scanner import CallScanner, call_events, malformed
from .model_tokenizer import ModelTokenizer

__all__ = ["STYLES", "TemplateCompletionParser", "ToolCallSyntax"]

STYLES = ("tags", "json", "none")


@dataclass(frozen=True, slots=True)
class ToolCallSyntax:
    """How a model writes tool calls (and reasoning), learned from its chat template."""

    style: Literal["tags", "json", "none"] = "tags"
    open_tag: str = "<tool_call>"
    close_tag: str = "</tool_call>"
    think_open: str = ""  # "<think>" when the template has reasoning
    think_close: str = "</think>"
    # What the template writes between a message's text and a call that follows it ("\n"
    # for ChatML and Qwen): the template's, not the message's, so it is not kept in the text.
    call_separator: str = ""


class TemplateCompletionParser:
    """Sampled token ids into engine events, for a model behind its own chat template (same
    interface as ``completion_parser.CompletionParser``; see the module docstring)."""

    def __init__(
        self,
        tokenizer: ModelTokenizer,
        syntax: ToolCallSyntax,
        stop_ids: Collection[int],
        *,
        tools: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._syntax = syntax
        self._stops = frozenset(stop_ids)
        # Tags are unambiguous; bare JSON is a call only when the request declares tools.
        self._tools = syntax.style == "tags" or (tools and syntax.style == "json")
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._ids: list[int] = []  # token ids not yet attributed to a delta
        self._mode: Literal["start", "text", "call", "json", "think"] = "start"
        self._hold = ""  # text that may be the start of a tag
        self._kind: str | None = None  # the open item
        self._call: CallScanner | None = None
        self._json_calls = False
        syntax = self._syntax
        tags = (syntax.open_tag, syntax.close_tag, syntax.think_open, syntax.think_close)
        found = {tokenizer.token_id(tag) for tag in tags if tag}
        self._tag_ids = frozenset(i for i in found if i is not None)
        self.finished = False
        self._closed = False
        self.items = 0
        self.last_kind: str | None = None

    # -- public ------------------------------------------------------------------------------

    def feed(self, token: int) -> list[EngineEvent]:
        """Consume one sampled token; return the events it completes."""
        if self.finished:
            return []
        if token in self._stops:
            events = self._flush()
            self.finished = True
            return events
        self._ids.append(token)
        tokenizer = self._tokenizer
        if tokenizer.is_special(token) and token not in self._tag_ids:
            return []  # a control token ([TOOL_CALLS]...): structure, not text
        text = self._decoder.decode(tokenizer.token_bytes(token))
        return self._text(text) if text else []

    def close(self) -> list[EngineEvent]:
        """The stream ended without a stop token (budget spent, or the backend stopped)."""
        # ``finished`` stays False: the model did not end its turn (``finish`` then reports
        # a budget cut as max_output_tokens, not as a completed answer).
        if self.finished or self._closed:
            return []
        self._closed = True
        events = self._text(self._decoder.decode(b"", final=True))
        call = self._call
        if call is not None and not (self._mode == "json" and _complete(call.body)):
            # Cut short inside a call: what was read of it ends incomplete.
            self._call = None
            self._mode = "start"
            if self._kind == "function_call":
                events += self._end(incomplete=True)
            return events
        return events + self._flush()

    # -- text --------------------------------------------------------------------------------

    def _text(self, text: str) -> list[EngineEvent]:
        events: list[EngineEvent] = []
        while text:
            mode = self._mode
            if mode == "start":
                stripped = text.lstrip()
                if not stripped:
                    self._hold += text
                    return events
                syntax = self._syntax
                if self._tools and syntax.style == "json" and stripped[0] in "{[":
                    self._mode = "json"
                    self._json_calls = stripped[0] == "["
                    self._call = CallScanner()
                    text = stripped
                    self._hold = ""
                    continue
                self._mode = "text"
                text = self._hold + text
                self._hold = ""
                continue
            if mode == "json":
                assert self._call is not None
                if self._json_calls:
                    self._call.body += text  # a list of calls: read whole at the end
                else:
                    events += self._call_events(self._call.feed(text))
                return events
            if mode in ("text", "think"):
                text = self._in_text(text, events)
                continue
            # mode == "call": up to the close tag
            text = self._in_call(text, events)
        return events

    def _openers(self) -> list[tuple[str, str]]:
        syntax = self._syntax
        openers: list[tuple[str, str]] = []
        if self._mode == "think":
            openers.append((syntax.think_close, "think_end"))
            return openers
        if self._tools and syntax.style == "tags":
            openers.append((syntax.open_tag, "call"))
        if syntax.think_open:
            openers.append((syntax.think_open, "think"))
        return openers

    def _in_text(self, text: str, events: list[EngineEvent]) -> str:
        """Text (a message, or reasoning) up to the next tag; returns what follows it."""
        buffer = self._hold + text
        self._hold = ""
        best: tuple[int, str, str] | None = None
        openers = self._openers()
        for tag, action in openers:
            at = buffer.find(tag)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, tag, action)
        if best is None:
            # Held back: what may begin a tag, with the separator the template puts before it.
            keep = max((_partial(buffer, self._lead(tag) + tag) for tag, _ in openers), default=0)
            self._hold = buffer[len(buffer) - keep :] if keep else ""
            self._say(buffer[: len(buffer) - keep], events)
            return ""
        at, tag, action = best
        before = buffer[:at]
        lead = self._lead(tag)
        if lead and before.endswith(lead):
            before = before[: -len(lead)]
        self._say(before, events)
        rest = buffer[at + len(tag) :]
        if self._kind is not None:
            events += self._end()
        if action == "call":
            self._mode = "call"
            self._call = CallScanner()
        elif action == "think":
            self._mode = "think"
            self._kind = "reasoning"
            events.append(ItemStart("reasoning"))
        else:  # the end of reasoning
            self._mode = "start"
        return rest

    def _lead(self, tag: str) -> str:
        """The template's separator before ``tag`` (only a call's, in a message's text)."""
        syntax = self._syntax
        return syntax.call_separator if tag == syntax.open_tag and self._mode == "text" else ""

    def _say(self, text: str, events: list[EngineEvent]) -> None:
        if not text:
            return
        if self._kind is None:
            if not text.strip():
                return  # whitespace between items opens no message
            self._kind = "message"
            events.append(ItemStart("message"))
            text = text.lstrip()
        events.append(Delta(text, self._take_ids()))

    def _in_call(self, text: str, events: list[EngineEvent]) -> str:
        call = self._call
        assert call is not None
        buffer = self._hold + text
        self._hold = ""
        close = self._syntax.close_tag
        at = buffer.find(close)
        if at < 0:
            keep = _partial(buffer, close)
            self._hold = buffer[len(buffer) - keep :] if keep else ""
            events += self._call_events(call.feed(buffer[: len(buffer) - keep]))
            return ""
        events += self._call_events(call.feed(buffer[:at]))
        events += self._end_call()
        self._mode = "start"
        return buffer[at + len(close) :]

    def _call_events(self, events: list[EngineEvent]) -> list[EngineEvent]:
        out: list[EngineEvent] = []
        for event in events:
            if isinstance(event, ItemStart):
                if self._kind is not None:
                    out += self._end()
                self._kind = "function_call"
                out.append(event)
            elif isinstance(event, Delta):
                out.append(Delta(event.text, self._take_ids()))
        return out

    def _end_call(self) -> list[EngineEvent]:
        call = self._call
        assert call is not None
        self._call = None
        events, _ = call.finish()
        out = self._call_events(events)
        return out + self._end()

    def _flush(self) -> list[EngineEvent]:
        """The model's turn ended: finish what is open."""
        events: list[EngineEvent] = []
        if self._hold and self._mode != "call":
            hold, self._hold = self._hold, ""
            if self._mode == "think":
                events.append(Delta(hold, self._take_ids()))
            else:
                self._say(hold, events)
        call, self._call = self._call, None
        if self._mode == "json" and call is not None:
            try:
                if self._json_calls:
                    return events + self._json_list(call.body)
                return events + self._json_sequence(call)
            except EngineError:
                if call.name is not None:
                    raise  # a call was announced: its JSON must hold
            # JSON that is not a call (an answer in JSON): a message, as vLLM's parsers do.
            self._mode = "text"
            self._say(call.body, events)
            return events + self._end()
        if self._mode == "call" and call is not None:
            raise malformed(f"it has no closing {self._syntax.close_tag}")
        return events + self._end()

    def _json_sequence(self, call: CallScanner) -> list[EngineEvent]:
        """Bare JSON: one call, or several separated by ``;`` or whitespace."""
        decoder = json.JSONDecoder()
        body, index = call.body, 0
        values: list[object] = []
        while True:
            while index < len(body) and (body[index].isspace() or body[index] == ";"):
                index += 1
            if index >= len(body):
                break
            try:
                value, index = decoder.raw_decode(body, index)
            except ValueError as exc:
                raise malformed(f"it is not JSON ({exc}): {body[:200]!r}") from None
            values.append(value)
        if not values:
            raise malformed("it is empty")
        first = CallScanner(
            body=json.dumps(values[0], ensure_ascii=False),
            name=call.name,
            streaming=call.streaming,
        )
        events = self._call_events(first.finish()[0]) + self._end()
        for value in values[1:]:
            events += self._call_events(call_events(value, True)[0]) + self._end()
        return events

    def _json_list(self, body: str) -> list[EngineEvent]:
        try:
            values = json.loads(body)
        except ValueError as exc:
            raise malformed(f"it is not JSON ({exc}): {body[:200]!r}") from None
        if not isinstance(values, list) or not values:
            raise malformed("a list of calls must hold at least one call")
        events: list[EngineEvent] = []
        for value in values:
            events += self._call_events(call_events(value, True)[0])
            events += self._end()
        return events

    def _end(self, incomplete: bool = False) -> list[EngineEvent]:
        kind, self._kind = self._kind, None
        if kind is None:
            return []
        self.items += 1
        self.last_kind = kind
        return [ItemEnd(incomplete=incomplete)]

    def _take_ids(self) -> tuple[int, ...]:
        ids, self._ids = tuple(self._ids), []
        return ids


def _complete(body: str) -> bool:
    """Whether a bare-JSON answer is complete JSON (one value, or several after ``;``)."""
    try:
        json.loads(body)
    except ValueError:
        return body.rstrip().endswith(("}", "]")) and body.count("{") == body.count("}")
    return True


def _partial(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that begins ``tag`` (a tag may be split)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0
