"""The core driven directly: a real core whose every route is one scripted engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.core.fake_engine import ScriptedCore, ScriptedEngine, started_core


@pytest.fixture
async def engine_and_core(tmp_path: Path) -> AsyncIterator[tuple[ScriptedEngine, ScriptedCore]]:
    """A started ``ScriptedCore`` and its engine (script its ``turns``); closed after."""
    async with started_core(tmp_path) as started:
        yield started
