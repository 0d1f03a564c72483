"""The ``template`` chat format: any open model, with its own tokenizer, chat template and
tool-call syntax (``model_tokenizer``, ``chat_template``, ``tool_calls``).

Everything comes from the model's files, offline: the tokenizer and the template from a
``tokenizer.json`` (with its ``tokenizer_config.json``) or a GGUF file, the template optionally
replaced by a ``.jinja`` file. From the template the format learns:

* the generation prompt (what ``add_generation_prompt`` appends; it must be a suffix of the
  render, as it is for every common template) that starts the model's turn;
* how the model calls tools: JSON in ``<tool_call>`` tags when the template writes them, else
  a bare JSON object when it takes ``tools``; ``tool_call_format`` overrides the guess;
* whether it reasons in ``<think>`` tags;
* the tokens that end its turn: the eos token and the common end-of-turn tokens it has.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import tiktoken
from bidi_responses.schema import (
    FunctionCallItem,
    Item,
    JSONValue,
    MessageItem,
    OutputTextPart,
)

from ..core.ports import EngineRequest
from .chat_template import ChatTemplate, TemplateRenderer
from .formats import ChatFormat, CompletionParserLike
from .model_tokenizer import ModelTokenizer, load_model_tokenizer
from .tool_calls import (
    STYLES,
    TemplateCompletionParser,
    ToolCallSyntax,
)

__all__ = ["TemplateSettings", "build_template_format"]

# End-of-turn tokens of the common model families, used as stops when the model has them.
_END_OF_TURN = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<|endoftext|>",
    "<end_of_turn>",
    "</s>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",
)
_PROBE: list[Item] = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
]


@dataclass(slots=True)
class TemplateSettings:
    """Where a route's model files are and how to read them."""

    # A tokenizer.json, the directory holding it, or a GGUF file.
    tokenizer: str
    # A .jinja file that replaces the model's own template ("" keeps the model's).
    chat_template: str = ""
    # "auto" (from the template), "tags", "json" or "none".
    tool_call_format: str = "auto"
    # Extra template variables (``enable_thinking``...), as ``chat_template_kwargs``.
    template_kwargs: Mapping[str, JSONValue] = field(default_factory=dict)


def build_template_format(
    settings: TemplateSettings,
    encoding: tiktoken.Encoding,
    open_compaction: Callable[[str], str] | None = None,
) -> ChatFormat:
    """The format of the model whose files ``settings`` names (ValueError saying why not)."""
    if not settings.tokenizer:
        raise ValueError("completions: format 'template' needs 'tokenizer' (a path)")
    model = load_model_tokenizer(settings.tokenizer)
    source = model.chat_template
    if settings.chat_template:
        path = Path(settings.chat_template)
        if not path.is_file():
            raise ValueError(f"completions: chat_template: no such file {str(path)!r}")
        source = path.read_text(encoding="utf-8")
    if not source:
        raise ValueError(
            f"completions: {settings.tokenizer!r} carries no chat template; set chat_template"
        )
    style = settings.tool_call_format
    if style == "auto":
        style = "tags" if "<tool_call>" in source else "json" if "tools" in source else "none"
    if style not in STYLES:
        raise ValueError(
            f"completions: unknown tool_call_format {style!r}; expected auto, {', '.join(STYLES)}"
        )
    template = ChatTemplate(
        source,
        bos_token=model.bos_token,
        eos_token=model.eos_token,
        extra=dict(settings.template_kwargs),
    )
    digest = hashlib.sha256(f"{model.source}\0{source}".encode()).hexdigest()[:12]
    renderer = TemplateRenderer(
        f"template:{Path(model.source).name}:{digest}", template, model, encoding, open_compaction
    )
    start = _generation_prompt(renderer)
    syntax = ToolCallSyntax(
        style="tags" if style == "tags" else "json" if style == "json" else "none",
        think_open="<think>" if "<think>" in source else "",
    )
    if syntax.style == "tags":
        syntax = replace(syntax, call_separator=_call_separator(renderer, syntax.open_tag))
    stops = _stop_ids(model)
    call_token = model.token_id(syntax.open_tag) if syntax.style == "tags" else None

    def request_parser(request: EngineRequest) -> CompletionParserLike:
        tools = bool(request.tools or request.forced_function)
        return TemplateCompletionParser(model, syntax, stops, tools=tools)

    arguments_key = "parameters" if syntax.style == "json" and '"parameters"' in source else None
    return ChatFormat(
        renderer.format_name,
        renderer,
        start,
        lambda: TemplateCompletionParser(model, syntax, stops),
        stop_token_ids=stops,
        request_parser=request_parser,
        open_call=lambda name: _open_call(model, syntax, name, arguments_key or "arguments"),
        call_token=call_token,
        sends_response_format=True,
        vocabulary=model,
    )


def _generation_prompt(renderer: TemplateRenderer) -> tuple[int, ...]:
    """The tokens ``add_generation_prompt`` appends (the model's turn begins after them)."""
    bare = renderer.render_text(None, [], _PROBE)
    opened = renderer.render_text(None, [], _PROBE, add_generation_prompt=True)
    if not opened.startswith(bare):
        raise ValueError(
            "completions: this chat template's generation prompt is not a suffix of the "
            "conversation's render, which the template format needs"
        )
    return tuple(renderer.tokenizer.encode(opened[len(bare) :]))


def _call_separator(renderer: TemplateRenderer, open_tag: str) -> str:
    """The whitespace the template writes between an assistant message's text and a call
    that follows it (``"\n"`` in ChatML and Qwen templates), "" when it writes none."""
    mark = "\u2060probe\u2060"
    part: OutputTextPart = {"type": "output_text", "text": mark, "annotations": []}
    answer: MessageItem = {"type": "message", "role": "assistant", "content": [part]}
    call: FunctionCallItem = {
        "type": "function_call",
        "call_id": "call_probe",
        "name": "probe",
        "arguments": "{}",
    }
    items: list[Item] = [*_PROBE, answer, call]
    tool: dict[str, JSONValue] = {"type": "function", "name": "probe", "parameters": {}}
    try:
        text = renderer.render_text(None, [tool], items)
    except Exception:  # a template that refuses the probe: no separator is known
        return ""
    after = text[text.find(mark) + len(mark) :] if mark in text else ""
    at = after.find(open_tag)
    separator = after[:at] if at > 0 else ""
    return separator if not separator.strip() else ""


def _stop_ids(model: ModelTokenizer) -> tuple[int, ...]:
    names = [model.eos_token, *model.end_tokens, *_END_OF_TURN]
    ids = {model.token_id(name) for name in names if name}
    return tuple(sorted(i for i in ids if i is not None and model.is_added(i)))


def _open_call(
    model: ModelTokenizer, syntax: ToolCallSyntax, name: str, arguments_key: str
) -> list[int]:
    """What opens a forced call to ``name``, so the model writes only the arguments."""
    head = f'{{"name": {json.dumps(name, ensure_ascii=False)}, "{arguments_key}": '
    if syntax.style == "tags":
        head = f"{syntax.open_tag}\n{head}"
    return model.encode(head)
