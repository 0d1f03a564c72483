"""Rendering a conversation to o200k token ids, in a harmony-style chat format.

The format (special tokens in angle brackets, everything else ordinary text)::

    <|start|>system<|message|>{instructions}<|end|>
    <|start|>developer<|message|># Tools\\n{tools as compact JSON}<|end|>
    <|start|>{role}<|message|>{text}<|end|>                         user/system/developer message
    <|start|>assistant<|channel|>final<|message|>{text}<|end|>      assistant message
    <|start|>assistant<|channel|>analysis<|message|>{summary}<|end|> reasoning
    <|start|>assistant to=functions.{name}<|channel|>commentary json<|message|>{arguments}<|call|>
    <|start|>functions.{name} to=assistant<|channel|>commentary<|message|>{output}<|end|>
    <|start|>developer<|message|># Compacted conversation\n{summary}<|end|>     compaction item
    <|start|>developer<|message|># Response Formats\n{format as JSON}<|end|>  structured output

A ``compaction`` item renders as the summary its sealed token carries (``core.runs.compaction``);
a structured-output format renders in the prefix, after the tools.

The engine appends ``<|start|>assistant`` itself before sampling.

Every item is bounded by special tokens and its text is encoded on its own, so the render of
a conversation is exactly the concatenation of the renders of its parts. That is what lets a
stream append the new items' tokens to its cached tokens instead of rendering the history
again; ``tests/core/test_render.py`` checks it over random splits of random conversations.
The one piece of context an item needs is the function name of a ``function_call_output``,
looked up by ``call_id`` in ``call_names``.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Protocol, TypeAlias, TypeVar

import orjson
import tiktoken
from bidi_responses.schema import Item, JSONObject, JSONValue, part_text

from ..api.jsonshape import canonical_json
from .tokenizer import (
    CALL,
    CHANNEL,
    END,
    MAX_PIECE_CHARS,
    MESSAGE,
    START,
    bounded_encoder,
    encode_parts,
)

TokenArray: TypeAlias = "array[int]"  # array('I') of token ids
#: What ``common_prefix`` compares: token arrays, or rendered texts.
Prefixable = TypeVar("Prefixable", str, "array[int]")


class RenderMemo(Protocol):
    """What a whole-conversation format keeps of its last render, to render the next turn
    without tokenizing the unchanged part again."""

    def approx_bytes(self) -> int:
        """Memory held, for the caches' byte budgets."""
        ...


class Renderer:
    """Turns instructions, tools and items into token ids with one shared encoding."""

    #: The chat format this renderer writes; tokens of different formats never mix.
    format_name = "generic"
    #: Whether the format renders a conversation whole (a model's own chat template) rather
    #: than item by item; the core then calls ``render_whole`` (see ``core.runs.continuation``).
    whole_conversation = False

    def __init__(
        self,
        encoding: tiktoken.Encoding,
        open_compaction: Callable[[str], str] | None = None,
        *,
        max_piece_chars: int = MAX_PIECE_CHARS,
    ) -> None:
        self._encoding = encoding
        # Token -> summary text, for compaction items (None: they cannot be rendered).
        self._open_compaction = open_compaction
        # encode_ordinary in time linear in the text (tokenizer.encode_bounded): a long run
        # without a piece boundary costs no more than ordinary text.
        self._encode = bounded_encoder(encoding, max_piece_chars)
        self._max_piece_chars = max_piece_chars
        self._header = lru_cache(maxsize=4096)(self._render_header)

    @property
    def encoding(self) -> tiktoken.Encoding:
        """The tiktoken encoding in use."""
        return self._encoding

    def _render_header(self, header: str, channel: str | None) -> tuple[int, ...]:
        ids = [START, *self._encode(header)]
        if channel is not None:
            ids += [CHANNEL, *self._encode(channel)]
        ids.append(MESSAGE)
        return tuple(ids)

    def _block(self, out: TokenArray, header: str, channel: str | None, body: str, end: int) -> int:
        start = len(out)
        out.extend(self._header(header, channel))
        if len(body) <= self._max_piece_chars:
            out.extend(self._encode(body))
        else:  # segment by segment: a huge body never becomes one list
            for part in encode_parts(self._encoding, body, self._max_piece_chars):
                out.extend(part)
        out.append(end)
        return len(out) - start

    def render_prefix(
        self,
        instructions: str | None,
        tools: list[JSONObject],
        response_format: JSONObject | None = None,
    ) -> TokenArray:
        """The tokens before the first item: instructions, tool definitions, output format."""
        out: TokenArray = array("I")
        if instructions:
            self._block(out, "system", None, instructions, END)
        if tools:
            spec = orjson.dumps(canonical_json(tools)).decode()
            self._block(out, "developer", None, "# Tools\n" + spec, END)
        if response_format:
            spec = orjson.dumps(canonical_json(response_format)).decode()
            self._block(out, "developer", None, "# Response Formats\n" + spec, END)
        return out

    def render_item(self, item: Item, call_names: Mapping[str, str], out: TokenArray) -> int:
        """Append one item's tokens to ``out``; return how many were added."""
        if item["type"] == "message":
            text = "".join(part_text(part) for part in item["content"])
            role = item["role"]
            if role == "assistant":
                return self._block(out, "assistant", "final", text, END)
            return self._block(out, role, None, text, END)
        if item["type"] == "function_call":
            header = f"assistant to=functions.{item['name']}"
            return self._block(out, header, "commentary json", item["arguments"], CALL)
        if item["type"] == "function_call_output":
            name = call_names.get(item["call_id"], "unknown")
            header = f"functions.{name} to=assistant"
            return self._block(out, header, "commentary", item["output"], END)
        if item["type"] == "reasoning":
            text = "\n".join(part["text"] for part in item.get("summary", ()))
            return self._block(out, "assistant", "analysis", text, END)
        if item["type"] == "custom_tool_call":
            header = f"assistant to=functions.{item.get('name', '')}"
            return self._block(out, header, "commentary", str(item.get("input", "")), CALL)
        if item["type"] == "custom_tool_call_output":
            name = call_names.get(str(item.get("call_id", "")), "unknown")
            header = f"functions.{name} to=assistant"
            return self._block(out, header, "commentary", str(item.get("output", "")), END)
        if item["type"] == "compaction":
            if self._open_compaction is None:
                raise ValueError("this renderer has no compaction key")
            summary = self._open_compaction(item["encrypted_content"])
            return self._block(out, "developer", None, "# Compacted conversation\n" + summary, END)
        body = orjson.dumps(canonical_json(item)).decode()
        return self._block(out, "developer", None, body, END)

    def render_whole(
        self,
        instructions: str | None,
        tools: Sequence[Mapping[str, JSONValue]],
        items: Iterable[Item],
        memo: RenderMemo | None,
    ) -> tuple[TokenArray, RenderMemo, int]:
        """Render a whole conversation (formats with ``whole_conversation``): its tokens, a
        memo of this render for the next one, and how many tokens were tokenized anew."""
        raise NotImplementedError(f"the {self.format_name} format renders item by item")

    def render_items(
        self, items: Iterable[Item], call_names: dict[str, str], out: TokenArray
    ) -> int:
        """Append items in order, learning call names as function calls go by."""
        added = 0
        for item in items:
            note_call(item, call_names)
            added += self.render_item(item, call_names, out)
        return added

    def render_conversation(
        self,
        instructions: str | None,
        tools: list[JSONObject],
        items: Iterable[Item],
        response_format: JSONObject | None = None,
    ) -> TokenArray:
        """A full render from scratch: the reference that incremental rendering must equal."""
        out = self.render_prefix(instructions, tools, response_format)
        self.render_items(items, {}, out)
        return out


def note_call(item: Item, call_names: dict[str, str]) -> None:
    """Remember the function name behind a call id, for rendering its output later."""
    if item["type"] == "function_call" or item["type"] == "custom_tool_call":
        call_names[item["call_id"]] = item.get("name", "")


def common_prefix(a: Prefixable, b: Prefixable) -> int:
    """The length of the longest common prefix of two token arrays, or of two strings
    (C-speed slice compares)."""
    if a is b:
        return len(a)
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo
