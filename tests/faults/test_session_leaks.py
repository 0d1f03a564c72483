"""Every session closes (``make faults``): 6,000 calls that read an error event and cancel at
once, then 2,000 ending in every other way; the smoke version (640 calls) is in
``tests/hostile/test_every_session_closes.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ServerFactory
from tests.hostile.test_every_session_closes import hammer


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.timeout(1200)
async def test_8000_calls_leave_no_session_open(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    await hammer(server_factory, tmp_path, 6_000, 2_000)
