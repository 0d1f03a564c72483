"""An open model's own chat template (Jinja), rendered as the well-known servers render it.

The template comes with the model (``tokenizer_config.json``'s ``chat_template`` or a GGUF's
``tokenizer.chat_template``). It is rendered in Jinja's immutable sandbox with what Hugging
Face transformers, vLLM, SGLang and llama.cpp give it: ``messages`` in the chat-completions
shape, ``tools`` (None when there are none), ``add_generation_prompt``, ``bos_token`` and
``eos_token``, ``raise_exception`` and ``strftime_now``, the ``loopcontrols`` extension,
``trim_blocks``/``lstrip_blocks``, a ``tojson`` that keeps key order and does not escape
non-ASCII text, and tool-call arguments as objects (parsed from the item's JSON string).

A template renders the whole conversation, and it is not always prefix-stable: a later turn
may change how earlier ones render (a tools block that moves to the last user message, a
system prompt that names the date, reasoning dropped from earlier turns). ``TemplateRenderer``
therefore renders the whole text each turn, keeps the tokens of the longest part of the
previous text that is unchanged (up to the last added token inside it, where tokenization
restarts), tokenizes only the rest, and says whether the previous tokens were still a prefix
(``WholeRender.kept``), so the core counts a break and never reports cached tokens the
backend cannot have.
"""

from __future__ import annotations

import bisect
import datetime
import json
import sys
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.ext
import tiktoken
from bidi_responses.schema import Item, JSONObject, JSONValue, part_text
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..core.ports import (
    ApiError,
    Renderer,
    RenderMemo,
    TokenArray,
    common_prefix,
    plain_numbers,
)
from .model_tokenizer import ModelTokenizer

__all__ = ["ChatTemplate", "TemplateMemo", "TemplateRenderer", "chat_messages"]


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Hugging Face transformers' own filter: key order kept, non-ASCII text as is.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class ChatTemplate:
    """One compiled chat template (see the module docstring)."""

    def __init__(
        self,
        source: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        extra: Mapping[str, object] | None = None,
    ) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"chat template: line {exc.lineno}: {exc.message}") from None
        self.source = source
        self._variables: dict[str, object] = {
            "bos_token": bos_token,
            "eos_token": eos_token,
            **(extra or {}),
        }

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        *,
        add_generation_prompt: bool,
    ) -> str:
        """The prompt text; ApiError (400) when the template refuses the conversation."""
        try:
            return self._template.render(
                messages=messages,
                tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt,
                **self._variables,
            )
        except jinja2.TemplateError as exc:
            # The model's template refuses this conversation (roles out of order...): the
            # request's fault, said in the template's own words.
            raise ApiError(
                f"The model's chat template cannot render this conversation: {exc}",
                code="invalid_conversation",
            ) from None


def template_tools(tools: Iterable[Mapping[str, JSONValue]]) -> list[dict[str, Any]]:
    """Function tools in the chat-completions shape templates expect, parameters in the
    client's key order."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool["name"],
                "description": tool.get("description") or "",
                "parameters": plain_numbers(tool.get("parameters"))
                or {"type": "object", "properties": {}},
            },
        }
        for tool in tools
        if tool.get("type") == "function"
    ]


def _arguments(raw: str) -> object:
    # Templates expect objects (they apply tojson); a string that is not JSON stays a string.
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return raw


def chat_messages(
    instructions: str | None,
    items: Iterable[Item],
    open_compaction: Callable[[str], str] | None = None,
) -> list[dict[str, Any]]:
    """The conversation as chat-completions messages, as vLLM and SGLang build them from
    Responses items: calls join the assistant turn they belong to, outputs are ``tool``
    messages, reasoning goes to the next assistant message's ``reasoning_content``."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    names: dict[str, str] = {}
    reasoning: list[str] = []

    def assistant() -> dict[str, Any]:
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and not reasoning:
            return last
        message: dict[str, Any] = {"role": "assistant", "content": ""}
        if reasoning:
            message["reasoning_content"] = "\n".join(reasoning)
            reasoning.clear()
        messages.append(message)
        return message

    for item in items:
        if item["type"] == "message":
            text = "".join(part_text(part) for part in item["content"])
            role = item["role"]
            if role == "assistant":
                message = assistant()
                if message.get("tool_calls") or message["content"]:
                    message = {"role": "assistant", "content": text}
                    messages.append(message)
                else:
                    message["content"] = text
            else:
                messages.append(
                    {"role": "system" if role == "developer" else role, "content": text}
                )
        elif item["type"] == "function_call":
            names[item["call_id"]] = item["name"]
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": _arguments(item["arguments"])},
            }
            assistant().setdefault("tool_calls", []).append(call)
        elif item["type"] == "function_call_output":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item["call_id"],
                    "name": names.get(item["call_id"], ""),
                    "content": str(item["output"]),
                }
            )
        elif item["type"] == "reasoning":
            parts = item.get("content") or item.get("summary") or ()
            reasoning.append("\n".join(part["text"] for part in parts))
        elif item["type"] == "compaction":
            if open_compaction is None:
                raise ValueError("this renderer has no compaction key")
            summary = open_compaction(item["encrypted_content"])
            messages.append({"role": "system", "content": "# Compacted conversation\n" + summary})
        elif item["type"] == "custom_tool_call":
            message = assistant()
            message["content"] += str(item.get("input", ""))
        elif item["type"] == "custom_tool_call_output":
            messages.append({"role": "tool", "content": str(item.get("output", ""))})
    return messages


@dataclass(slots=True)
class TemplateMemo:
    """The last render of a conversation: its text, tokens and the points where an added
    token starts (character start, character end, token index)."""

    text: str
    tokens: TokenArray
    splits: list[tuple[int, int, int]]

    def approx_bytes(self) -> int:
        """The text and the split points (the tokens are the state's own array)."""
        return sys.getsizeof(self.text) + 72 * len(self.splits)


class TemplateRenderer(Renderer):
    """Renders conversations with the model's chat template and tokenizer.

    Unlike the item-by-item formats it renders the conversation whole
    (``whole_conversation``): the core calls ``render_whole`` with the conversation so far and
    the memo of the previous render.
    """

    whole_conversation = True

    def __init__(
        self,
        name: str,
        template: ChatTemplate,
        tokenizer: ModelTokenizer,
        encoding: tiktoken.Encoding,
        open_compaction: Callable[[str], str] | None = None,
    ) -> None:
        super().__init__(encoding, open_compaction)
        self.format_name = name
        self.template = template
        self.tokenizer = tokenizer

    # -- text --------------------------------------------------------------------------------

    def render_text(
        self,
        instructions: str | None,
        tools: Sequence[Mapping[str, JSONValue]],
        items: Iterable[Item],
        *,
        add_generation_prompt: bool = False,
    ) -> str:
        """The template's text for a conversation."""
        messages = chat_messages(instructions, items, self._open_compaction)
        return self.template.render(
            messages, template_tools(tools), add_generation_prompt=add_generation_prompt
        )

    # -- tokens ------------------------------------------------------------------------------

    def render_whole(
        self,
        instructions: str | None,
        tools: Sequence[Mapping[str, JSONValue]],
        items: Iterable[Item],
        memo: RenderMemo | None,
    ) -> tuple[TokenArray, TemplateMemo, int]:
        """Render the conversation and tokenize what changed since ``memo``'s render; returns
        the tokens, the memo of this render and how many tokens were tokenized anew."""
        text = self.render_text(instructions, tools, items)
        bos = self.tokenizer.bos_token
        if self.tokenizer.add_bos and bos and not text.startswith(bos):
            # The model's tokenizer adds bos and its template did not write it: the prompt
            # starts with it, as llama.cpp tokenizes a chat (one bos, never two).
            text = bos + text
        if not isinstance(memo, TemplateMemo):
            memo = None
        start_char, start_token, kept_splits = 0, 0, 0
        # Byte-level BPE tokenizes each stretch between added tokens on its own (tested
        # against full tokenization); other tokenizers (SentencePiece's "prepend a space to
        # the first piece") are tokenized whole every turn, which is always exact.
        if memo is not None and self.tokenizer.byte_level:
            same = common_prefix(memo.text, text)
            # The last added token that lies wholly in the unchanged text: tokenization
            # restarts there, so the tokens before it stand.
            ends = [end for _, end, _ in memo.splits]
            kept_splits = bisect.bisect_right(ends, same)
            if kept_splits:
                start_char, _, start_token = memo.splits[kept_splits - 1]
                kept_splits -= 1
        ids, splits = self.tokenizer.encode_with_splits(text[start_char:])
        tokens: TokenArray = array("I")
        all_splits: list[tuple[int, int, int]] = []
        if memo is not None and start_token:
            tokens = memo.tokens[:start_token]
            all_splits = memo.splits[:kept_splits]
        tokens.extend(ids)
        for start, end, index in splits:
            all_splits.append((start_char + start, start_char + end, start_token + index))
        return tokens, TemplateMemo(text, tokens, all_splits), len(ids)

    def render_conversation(
        self,
        instructions: str | None,
        tools: list[JSONObject],
        items: Iterable[Item],
        response_format: JSONObject | None = None,
    ) -> TokenArray:
        """A full render from scratch (token counts, tests)."""
        return self.render_whole(instructions, tools, items, None)[0]

    def render_prefix(
        self,
        instructions: str | None,
        tools: list[JSONObject],
        response_format: JSONObject | None = None,
    ) -> TokenArray:
        """The render of the instructions and tools alone (a template renders them with the
        messages, so this is only what a conversation without messages renders)."""
        return self.render_conversation(instructions, tools, [])

    def render_item(self, item: Item, call_names: Mapping[str, str], out: TokenArray) -> int:
        """Not available: a chat template renders the conversation whole (``render_whole``)."""
        raise NotImplementedError("a chat template renders the whole conversation")
