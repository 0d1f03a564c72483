"""What the tests that drive ``Session`` directly share: a create event, a session bounded in
time, and reading its events up to one the test waits for."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

from bidi_responses.server.core.lanes import StreamNaming
from bidi_responses.server.core.lanes.session import Session

from tests.core.fake_engine import ScriptedCore, ScriptedEngine

TIMEOUT_S = 20
TERMINAL = ("response.completed", "response.incomplete", "response.failed")
SHELL = {
    "type": "function",
    "name": "shell",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}
EngineAndCore = tuple[ScriptedEngine, ScriptedCore]
Event = dict[str, Any]


def create(**body: Any) -> Event:
    """A ``response.create`` client event on the scripted model."""
    return {"type": "response.create", "model": "sim-model", "input": "hi", **body}


@asynccontextmanager
async def session_of(core: ScriptedCore) -> AsyncIterator[Session]:
    """A stream session on ``core`` for at most ``TIMEOUT_S``, closed after."""
    session = core.open_session(StreamNaming("test"))
    try:
        async with asyncio.timeout(TIMEOUT_S):
            yield session
    finally:
        await core.close_session(session)


async def until(session: Session, done: Callable[[Event], bool]) -> list[Event]:
    """The session's events (as a client reads them: plain JSON) up to and including the first
    one ``done`` accepts."""
    seen: list[Event] = []
    async for out in session.events():
        event = cast(Event, out.data)
        seen.append(event)
        if done(event):
            return seen
    raise AssertionError(f"the session ended first; saw {[e['type'] for e in seen]}")
