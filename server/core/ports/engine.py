"""The one small interface every inference engine implements: token ids in, tokens/items out.

The core renders the conversation to token ids and hands them to an engine. The engine streams
back what the model produces as a short sequence of events: an item starts (text or a function
call), pieces of it arrive (each with the token ids it is made of), the item ends, and finally
the engine reports its own timing. The core turns those into Responses events, so engines know
nothing about the wire.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

# Free JSON (a tool's JSON schema, an upstream's event, a backend's chunk): engines check
# what they read of it.
from bidi_responses.schema import Item, JSONValue

from ..api.tools import FunctionSpec


class EngineAffinity:
    """What an engine keeps for one stream lane between its turns, such as an upstream
    connection. The lane owns it and closes it when the stream ends (``aclose``)."""

    def __init__(self) -> None:
        self.values: dict[str, object] = {}
        self._closers: list[Callable[[], Awaitable[None]]] = []

    def on_close(self, closer: Callable[[], Awaitable[None]]) -> None:
        """Run ``closer`` when the lane's stream ends."""
        self._closers.append(closer)

    async def aclose(self) -> None:
        """Release everything engines kept for the lane."""
        closers, self._closers = self._closers, []
        self.values.clear()
        for closer in closers:
            try:
                await closer()
            except Exception:  # a failed close must not keep the others from running
                continue


@dataclass(frozen=True, slots=True)
class EngineConversation:
    """The conversation as items, for engines that speak items rather than tokens (an
    upstream Responses API). ``items`` is the whole conversation so far, in order, and is the
    same list object from turn to turn while the conversation goes on (engines must not
    change it); ``affinity`` is the lane's per-engine state."""

    items: Sequence[Item]
    instructions: str | None
    tools: Sequence[Mapping[str, JSONValue]]
    affinity: EngineAffinity


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """Everything an engine gets for one sampling segment.

    ``prompt_tokens`` is the rendered conversation (see ``core.rendering.render``); the engine
    appends
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
    response_format: Mapping[str, JSONValue] | None = None
    # Sampling settings from the request, for engines that sample for real.
    temperature: float = 1.0
    top_p: float = 1.0
    # The same conversation as items, for item-level engines.
    conversation: EngineConversation | None = None
    # Whether deltas that arrive together may be handed on as one (the server merges them
    # anyway, ``streaming.coalesce_deltas``); off, each token's delta is its own event.
    merge_deltas: bool = True


@dataclass(frozen=True, slots=True)
class ItemStart:
    """A new output item begins: a message, a function call or reasoning (shown whole, when
    it ends, as a reasoning item whose summary is the text)."""

    kind: Literal["message", "function_call", "reasoning"]
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
    overhead can be measured as the client-observed time minus this. ``prompt_tokens`` is what
    the engine received as its prompt and ``cached_tokens`` how many of those its own prefix
    (KV) cache served, as a real backend reports them (0 where it reports nothing).
    """

    # "steered": the core stopped consuming at an output boundary (the engine never says it).
    reason: Literal["stop", "tool_calls", "max_output_tokens", "steered"]
    output_tokens: int
    prefill_tokens: int
    engine_seconds: float
    extra: dict[str, JSONValue] = field(default_factory=dict)
    prompt_tokens: int = 0
    cached_tokens: int = 0


EngineEvent = ItemStart | Delta | ItemEnd | EngineFinish


class EngineError(Exception):
    """The engine could not produce the response: its backend is down, slow or answered badly.

    The core ends the response as ``failed`` with ``error.code`` = ``code`` and this message
    (no stack trace: the backend, not the server, is at fault), and the stream goes on.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Engine(Protocol):
    """An inference engine. ``generate`` must stop promptly when its task is cancelled."""

    name: str

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineEvent]:
        """Stream the model's output for ``request``; the last event is an EngineFinish."""
        ...


async def close_engine(engine: Engine) -> None:
    """Release what an engine holds (connection pools); engines without ``aclose`` hold none."""
    aclose = getattr(engine, "aclose", None)
    if aclose is not None:
        await aclose()
