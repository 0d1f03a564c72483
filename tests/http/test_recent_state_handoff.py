"""An HTTP response that ends while its replica drains leaves its rendered state in the shared
tier (PostgreSQL), and the replica that gets the next HTTP turn continues from it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from bidi_responses.cluster.postgres import TempPostgres

from tests.conftest import SHELL_TOOL, ServerFactory, make_config, until
from tests.store.conftest import fresh_database, postgres_server

__all__ = ["postgres_server"]  # the fixture, shared with the store's tests

pytestmark = pytest.mark.timeout(60)


def _next_turn(response: dict[str, Any]) -> dict[str, Any]:
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    return {
        "model": "sim-model",
        "previous_response_id": response["id"],
        "tools": [SHELL_TOOL],
        "input": [
            {"type": "function_call_output", "call_id": call["call_id"], "output": "y" * 4000}
            for call in calls
        ],
    }


async def test_an_http_response_ending_in_a_drain_continues_from_its_state_elsewhere(
    postgres_server: TempPostgres, server_factory: ServerFactory, tmp_path: Path
) -> None:
    async with asyncio.timeout(40):
        url = await fresh_database(postgres_server)
        replicas = []
        for name in ("a", "b"):
            config = make_config(tmp_path / name, tool_rounds=100, ttft_ms=300)
            config.store.url = url
            replicas.append(await server_factory(config, http=True))
        a, b = replicas
        async with (
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{a.http_port}", timeout=20) as on_a,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{b.http_port}", timeout=20) as on_b,
        ):
            body: dict[str, Any] = {"model": "sim-model", "input": "go", "tools": [SHELL_TOOL]}
            first = (await on_a.post("/v1/responses", json=body)).json()
            second = (await on_a.post("/v1/responses", json=_next_turn(first))).json()
            # The third turn is in flight (300 ms to its first token) when the drain begins.
            third_reply = asyncio.ensure_future(on_a.post("/v1/responses", json=_next_turn(second)))
            await until(lambda: bool(a.core.deps.state.inflight))
            stopping = asyncio.ensure_future(a.stop(grace=5))
            third = (await third_reply).json()
            await stopping
            assert third["status"] == "completed"
            resumed = (await on_b.post("/v1/responses", json=_next_turn(third))).json()
            rebuilt = (await on_b.post("/v1/responses", json=_next_turn(third))).json()
        assert a.core.deps.state.failover["states_handed_off"] == 1
        assert b.core.stats()["failover"]["states_restored"] == 1
        assert resumed["stats"]["items_validated"] == 1
        # The second continuation of the same id found no state: rebuilt from the store, the
        # same figures.
        assert rebuilt["stats"]["items_validated"] > 5
        assert resumed["usage"] == rebuilt["usage"]
