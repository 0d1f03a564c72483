"""Conversations rendered to token ids: the o200k tokenizer and the default chat format."""

from .render import Renderer, RenderMemo, TokenArray, common_prefix
from .tokenizer import load_encoding

__all__ = ["RenderMemo", "Renderer", "TokenArray", "common_prefix", "load_encoding"]
