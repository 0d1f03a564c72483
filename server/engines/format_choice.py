"""Picking a route's chat format by name: the project's own (``generic``), gpt-oss's
(``harmony``) or an open model's own tokenizer and chat template (``template``). Apart from
``formats``, which the formats themselves import, so that none of them imports back the module
that chooses between them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import tiktoken

from ..core.ports import START, Renderer
from .formats import FORMATS, ChatFormat
from .sampled_ids import TiktokenVocabulary

if TYPE_CHECKING:
    # Imported when used: the template format needs the models extra (tokenizers, jinja2).
    from .template_format import TemplateSettings

__all__ = ["FORMATS", "build_format"]


def build_format(
    name: str,
    encoding: tiktoken.Encoding,
    open_compaction: Callable[[str], str] | None = None,
    settings: TemplateSettings | None = None,
) -> ChatFormat:
    """The chat format called ``name`` over the tiktoken ``encoding``; ``open_compaction``
    turns a compaction item's sealed content back into its summary (``core.runs.compaction``).
    ``"template"`` needs ``settings``: where the model's tokenizer and template are."""
    if name == "template":
        from .template_format import build_template_format

        if settings is None:
            raise ValueError("the template format needs the model's tokenizer (settings)")
        return build_template_format(settings, encoding, open_compaction)
    start = (START, *encoding.encode_ordinary("assistant"))
    if name == "generic":
        from .completion_parser import CompletionParser

        renderer = Renderer(encoding, open_compaction)
        return ChatFormat(
            "generic",
            renderer,
            start,
            lambda: CompletionParser(encoding),
            vocabulary=TiktokenVocabulary(encoding),
        )
    if name == "harmony":
        from .harmony import (
            HarmonyCompletionParser,
            HarmonyRenderer,
            load_harmony,
        )

        harmony = load_harmony()
        return ChatFormat(
            "harmony",
            HarmonyRenderer(encoding, open_compaction),
            start,
            lambda: HarmonyCompletionParser(harmony),
            vocabulary=TiktokenVocabulary(encoding),
        )
    raise ValueError(f"unknown chat format {name!r}; expected one of {', '.join(FORMATS)}")
