"""Chat formats: how a model's prompt is rendered and how its completions are parsed.

A real model must see the prompt format it was trained on. A ``ChatFormat`` pairs a renderer
(the conversation to token ids; the core uses it for every route whose engine names it) with
a parser for what the model samples after the assistant start, and knows how a forced tool
call opens. ``generic`` is the project's own harmony-style format (``core.rendering.render``),
which the
simulated engines use; ``harmony`` is the gpt-oss format through ``openai-harmony``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from bidi_responses.schema import FunctionCallItem

from ..core.ports import CALL, RETURN, EngineEvent, EngineRequest, Renderer
from .sampled_ids import Vocabulary

#: The format names a completions route accepts ("template": the model's own tokenizer and
#: chat template, see ``template_format``).
FORMATS: tuple[str, ...] = ("generic", "harmony", "template")
#: The formats with a built-in vocabulary (o200k), rendered item by item.
ITEM_FORMATS: tuple[str, ...] = ("generic", "harmony")


class CompletionParserLike(Protocol):
    """Sampled token ids in, engine events out (see ``completion_parser``)."""

    finished: bool
    last_kind: str | None

    def feed(self, token: int) -> list[EngineEvent]:
        """Consume one sampled token."""
        ...

    def close(self) -> list[EngineEvent]:
        """The stream ended."""
        ...


@dataclass(frozen=True, slots=True)
class ChatFormat:
    """One model family's prompt format (see the module docstring)."""

    name: str
    renderer: Renderer
    # What ends every prompt: the model's turn begins here.
    assistant_start: tuple[int, ...]
    new_parser: Callable[[], CompletionParserLike]
    # Tokens that end the model's turn (sent as ``stop_token_ids``).
    stop_token_ids: tuple[int, ...] = (RETURN, CALL)
    # A parser that depends on the request (whether it declares tools), if the format has one.
    request_parser: Callable[[EngineRequest], CompletionParserLike] | None = None
    # How a forced call opens, when the renderer cannot say (``call_header``).
    open_call: Callable[[str], list[int]] | None = None
    # The one token that opens a tool call, banned when ``tool_choice`` is "none".
    call_token: int | None = None
    # A structured-output schema goes to the backend's constrained decoding as the request's
    # ``response_format`` (vLLM, SGLang) instead of into the prompt.
    sends_response_format: bool = False
    # The model's vocabulary, to work out ids a backend's stream does not report
    # (``sampled_ids``); None: the ids are taken as reported.
    vocabulary: Vocabulary | None = None

    def parser_for(self, request: EngineRequest) -> CompletionParserLike:
        """A parser for one sampling segment of ``request``."""
        if self.request_parser is not None:
            return self.request_parser(request)
        return self.new_parser()

    def call_header(self, name: str) -> list[int]:
        """The tokens that open a call to function ``name`` after the assistant start, as the
        renderer writes them (so a forced call looks like one the model opened itself)."""
        if self.open_call is not None:
            return self.open_call(name)
        item: FunctionCallItem = {
            "type": "function_call",
            "call_id": "",
            "name": name,
            "arguments": "",
        }
        tokens = self.renderer.render_conversation(None, [], [item])
        prefix = len(self.renderer.render_prefix(None, []))
        start = len(self.assistant_start)
        # [prefix][assistant start][header ... <|message|>][<|call|>]
        return list(tokens[prefix + start : -1])
