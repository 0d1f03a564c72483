"""The one small interface every inference engine implements: token ids in, tokens/items out.

The core renders the conversation to token ids and hands them to an engine. The engine streams
back what the model produces as a short sequence of events: an item starts (text or a function
call), pieces of it arrive (each with the token ids it is made of), the item ends, and finally
the engine reports its own timing. The core turns those into Responses events, so engines know
nothing about the wire.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol


@dataclass(frozen=True, slots=True)
class FunctionSpec:
    """A callable function tool as the engine sees it (name and JSON-schema parameters)."""

    name: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """Everything an engine gets for one sampling segment.

    ``prompt_tokens`` is the rendered conversation (see ``core.render``); the engine appends
    the assistant start itself. ``tool_rounds`` is how many tool-calling turns the conversation
    already contains since its last user message, which the simulated engine uses to decide
    whether to call tools again or answer. ``turn_index`` counts the model turns (sampling
    segments) the conversation already had, which the script engine uses to pick its line.
    """

    prompt_tokens: Sequence[int]
    tools: tuple[FunctionSpec, ...]
    tool_choice: str = "auto"
    forced_function: str | None = None
    max_output_tokens: int | None = None
    parallel_tool_calls: bool = True
    tool_rounds: int = 0
    turn_index: int = 0
    seed: int = 0
    # Structured output: the request's ``text.format`` when it is ``json_schema`` or
    # ``json_object``; a text answer must then be JSON of that shape.
    response_format: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ItemStart:
    """A new output item begins: a message (``kind="message"``) or a function call."""

    kind: Literal["message", "function_call"]
    name: str = ""
    call_id: str = ""


@dataclass(frozen=True, slots=True)
class Delta:
    """The next piece of the current item: text (or argument JSON) and its token ids."""

    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ItemEnd:
    """The current item ends; ``incomplete`` when the output budget cut it short."""

    incomplete: bool = False


@dataclass(slots=True)
class EngineFinish:
    """Last event of a segment: why it stopped and the engine's own costs.

    ``engine_seconds`` is the engine's own time (time to first token plus decoding), so the API
    overhead can be measured as the client-observed time minus this.
    """

    reason: Literal["stop", "tool_calls", "max_output_tokens"]
    output_tokens: int
    prefill_tokens: int
    engine_seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


EngineEvent = ItemStart | Delta | ItemEnd | EngineFinish


class Engine(Protocol):
    """An inference engine. ``generate`` must stop promptly when its task is cancelled."""

    name: str

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineEvent]:
        """Stream the model's output for ``request``; the last event is an EngineFinish."""
        ...
