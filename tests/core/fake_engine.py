"""A scripted engine and a core that routes every model to it, for driving the core directly.

The engine is the one thing these tests fake: it plays back a script per turn (text deltas,
function calls, an engine error, or a pause that only cancellation ends) and records each
request, so the tests can check the prompt tokens the core hands it. Everything else
(session, runner, cache, SQLite store, post-inference queue) is the real core.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bidi_responses.server.assembly import compose
from bidi_responses.server.config import RouteConfig
from bidi_responses.server.core.ports import (
    Delta,
    Engine,
    EngineError,
    EngineEvent,
    EngineFinish,
    EngineRequest,
    ItemEnd,
    ItemStart,
)
from bidi_responses.server.core.service import ResponsesCore

from tests.conftest import make_config


@dataclass(frozen=True)
class Call:
    """A function call the engine makes."""

    call_id: str
    name: str
    arguments: str = "{}"


@dataclass
class Turn:
    """What the engine does for one request: stream ``deltas`` as one message (none if
    empty), then ``calls``, then finish; or fail with ``fail`` after the deltas, or wait on
    ``hold`` (set by the test) after them."""

    deltas: tuple[str, ...] = ("Hello", " world")
    fail: str | None = None
    hold: asyncio.Event | None = None
    calls: tuple[Call, ...] = ()
    # Wait on this inside the first call's item, after its arguments (set by the test).
    call_hold: asyncio.Event | None = None
    # Wait on this before the first item, as a model still prefilling (set by the test).
    first_hold: asyncio.Event | None = None


@dataclass
class ScriptedEngine:
    """Plays ``turns`` in order, one per request; records every request."""

    turns: list[Turn] = field(default_factory=list)
    requests: list[EngineRequest] = field(default_factory=list)
    # Each request's prompt as it was asked (the core keeps extending its token array).
    prompts: list[list[int]] = field(default_factory=list)
    # Set once a held turn has streamed its deltas.
    holding: asyncio.Event = field(default_factory=asyncio.Event)
    # Set when the core cancels a held turn (its client went away, or it was cancelled).
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    name: str = "scripted"

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineEvent]:
        self.requests.append(request)
        self.prompts.append(list(request.prompt_tokens))
        turn = self.turns.pop(0)
        if turn.first_hold is not None:
            self.holding.set()
            try:
                await turn.first_hold.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        if turn.deltas:
            yield ItemStart("message")
            for index, text in enumerate(turn.deltas):
                yield Delta(text, (index,))
            if turn.fail is not None:
                raise EngineError("backend_failed", turn.fail)
            if turn.hold is not None:
                self.holding.set()
                try:
                    await turn.hold.wait()
                except asyncio.CancelledError:
                    self.cancelled.set()
                    raise
            yield ItemEnd()
        for index, call in enumerate(turn.calls):
            yield ItemStart("function_call", name=call.name, call_id=call.call_id)
            yield Delta(call.arguments, (0,))
            if index == 0 and turn.call_hold is not None:
                self.holding.set()
                await turn.call_hold.wait()
            yield ItemEnd()
        output_tokens = len(turn.deltas) + len(turn.calls)
        reason: Literal["tool_calls", "stop"] = "tool_calls" if turn.calls else "stop"
        yield EngineFinish(reason, output_tokens, len(request.prompt_tokens), 0.0)


class ScriptedCore(ResponsesCore):
    """The real core, with every route served by one scripted engine (passed in through the
    composition root's engine factory)."""

    def __init__(self, tmp_path: Path, engine: ScriptedEngine, **kwargs: Any) -> None:
        self.engine = engine
        config = make_config(tmp_path)
        super().__init__(config, compose(config, engine_factory=self._engine_for, **kwargs))

    def _engine_for(self, route: RouteConfig) -> Engine:
        return self.engine


@contextlib.asynccontextmanager
async def started_core(tmp_path: Path) -> AsyncIterator[tuple[ScriptedEngine, ScriptedCore]]:
    """A started ``ScriptedCore`` and its engine (script its ``turns``); closed after."""
    engine = ScriptedEngine()
    core = ScriptedCore(tmp_path, engine)
    await core.start()
    try:
        yield engine, core
    finally:
        await core.close()
