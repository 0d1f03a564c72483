"""Closed streams leave nothing behind in the API server (object counts, not RSS)."""

from __future__ import annotations

import asyncio
import gc

from bidi_responses.client import AsyncResponsesClient
from bidi_responses.server.core.conversation.state import ResponseCache
from bidi_responses.server.core.lanes.session import Session
from bidi_responses.server.core.runs.record import ResponseRecord
from bidi_responses.server.core.runs.runner import ResponseRun

from tests.conftest import SHELL_TOOL, ServerFactory


def _live(kind: type) -> int:
    gc.collect()
    return sum(1 for obj in gc.get_objects() if type(obj) is kind)


async def _agent(client: AsyncResponsesClient, index: int, turns: int) -> None:
    async with client.connect() as stream:
        response = await stream.create(
            model="sim-model",
            input=f"agent {index}: fix the failing test",
            tools=[SHELL_TOOL],
            store=index % 2 == 0,
        )
        for _ in range(turns - 1):
            calls = response.function_calls
            response = await stream.create(
                model="sim-model",
                tools=[SHELL_TOOL],
                previous_response_id=response.id,
                store=index % 2 == 0,
                input=[
                    {"type": "function_call_output", "call_id": c["call_id"], "output": "ok"}
                    for c in calls
                ]
                or "go on",
            )


async def test_streams_release_their_state_when_they_close(server_factory: ServerFactory) -> None:
    running = await server_factory(tool_rounds=10)
    core = running.core
    kinds = (Session, ResponseCache, ResponseRun, ResponseRecord)
    async with asyncio.timeout(60), AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as c:
        baseline = {kind: _live(kind) for kind in kinds}
        async with c.connect() as stream:  # the count does see an open stream
            await stream.create(model="sim-model", input="hi", store=False)
            assert _live(Session) == baseline[Session] + 1
            assert _live(ResponseCache) > baseline[ResponseCache]
        await core.wait_until_idle()
        for _ in range(2):  # a second burst must not add to what the first left
            await asyncio.gather(*(_agent(c, i, 4) for i in range(20)))
            await core.wait_until_idle()
            assert core.sessions_open == 0 and not core.deps.state.inflight
            assert len(core.deps.cache_budget) == 0 and core.deps.cache_budget.used == 0
            assert {kind: _live(kind) for kind in kinds} == baseline
