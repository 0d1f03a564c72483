"""The core driven directly: a real core whose every route is one scripted engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.core.fake_engine import ScriptedCore, ScriptedEngine


@pytest.fixture
async def engine_and_core(tmp_path: Path) -> AsyncIterator[tuple[ScriptedEngine, ScriptedCore]]:
    """A started ``ScriptedCore`` and its engine (script its ``turns``); closed after."""
    engine = ScriptedEngine()
    core = ScriptedCore(tmp_path, engine)
    await core.start()
    try:
        yield engine, core
    finally:
        await core.close()
