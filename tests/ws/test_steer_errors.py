"""Bad steering input over WebSocket mode: one ``response.steer.failed`` naming the field, and
the connection goes on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.ws.conftest import Connect, final

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("steer", "field"),
    [
        ({"stream_id": "a", "input": "x"}, "stream_id"),
        ({"input": [{"role": "system", "content": "x"}]}, "input[0].role"),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]},
            "input[0].type",
        ),
        ({"input": [{"role": "user", "content": "x", "name": "n"}]}, "input[0].name"),
        ({"input": 7}, "input"),
    ],
)
async def test_a_bad_steer_fails_naming_the_field(
    connect: Connect, steer: dict[str, Any], field: str
) -> None:
    async with asyncio.timeout(20), connect() as sock:
        done = final(await sock.create(model="sim-model", input="hi", store=False))
        await sock.send({"type": "response.steer", "previous_response_id": done["id"], **steer})
        failed = await sock.recv()
        after = await sock.create(model="sim-model", input="hi", store=False)

    assert failed["type"] == "response.steer.failed"
    assert failed["error"]["code"] == "invalid_input"
    assert f"'{field}" in failed["error"]["message"]
    assert failed["steer"]["previous_response_id"] == done["id"]
    assert failed["steer"]["input"] == steer["input"]
    assert "stream_id" not in failed  # the default lane's events carry none
    assert final(after)["status"] == "completed"
