"""``Conversation``: the client's failover helper, against a server that drains and is
replaced on the same address (one machine, SQLite: the store survives the restart)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
from bidi_responses.bench.ports import free_port
from bidi_responses.client import (
    AsyncResponsesClient,
    Conversation,
    FunctionCallItem,
    FunctionCallOutputItem,
    ResponsesError,
    run_resilient_agent,
)
from bidi_responses.server.app import RunningServer

from tests.conftest import SHELL_TOOL, ServerFactory, make_config

pytestmark = pytest.mark.timeout(60)


def _output(call: FunctionCallItem) -> list[FunctionCallOutputItem]:
    return [{"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}]


async def test_a_conversation_moves_to_the_next_server_after_a_drain(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    async with asyncio.timeout(40):
        config = make_config(tmp_path, tool_rounds=100)
        config.grpc_port = free_port()
        first: RunningServer = await server_factory(config)
        async with AsyncResponsesClient(f"127.0.0.1:{config.grpc_port}") as client:
            conversation = Conversation(client, backoff_s=0.02)
            response = await conversation.create(model="sim-model", input="go", tools=[SHELL_TOOL])
            await first.stop(grace=5)  # drain: the stream gets server_draining, then ends
            # The replacement (same address, same data) comes up while the client retries.
            replacement = asyncio.ensure_future(server_factory(config))
            second = await conversation.create(
                model="sim-model",
                previous_response_id=response.id,
                input=_output(response.function_calls[0]),
                tools=[SHELL_TOOL],
            )
            await replacement
            assert second.status == "completed"
            assert second.previous_response_id == response.id
            assert conversation.reconnects >= 2  # a new stream after the drain
            # A request no retry can fix is raised at once, not retried.
            retries = conversation.retries
            with pytest.raises(ResponsesError) as bad:
                await conversation.create(model="no-such-model", input="x")
            assert bad.value.code == "model_not_found"
            assert conversation.retries == retries
            await conversation.close()


async def test_a_conversation_gives_up_at_its_deadline(tmp_path: Path) -> None:
    async with asyncio.timeout(20):
        port = free_port()  # nothing listens here
        async with AsyncResponsesClient(f"127.0.0.1:{port}") as client:
            conversation = Conversation(client, deadline_s=0.5, backoff_s=0.05)
            with pytest.raises(TimeoutError, match=r"not acknowledged within 0\.5 s"):
                await conversation.create(model="sim-model", input="go")
            assert conversation.retries >= 2


async def test_run_resilient_agent_chains_its_turns(server: RunningServer) -> None:
    async with asyncio.timeout(20):
        async with AsyncResponsesClient(f"127.0.0.1:{server.grpc_port}") as client:
            conversation = Conversation(client)
            turns = await run_resilient_agent(
                conversation,
                model="sim-model",
                input="fix it",
                tools=[SHELL_TOOL],
                tool_output=lambda call: f"ran {call['name']}",
                turns=10,
            )
            await conversation.close()
        # The sim answers after 3 tool rounds: 4 responses, each continuing the one before.
        assert [t.status for t in turns] == ["completed"] * 4
        assert not turns[-1].function_calls and turns[-1].output_text
        for before, after in itertools.pairwise(turns):
            assert after.previous_response_id == before.id
        assert conversation.reconnects == 1 and conversation.retries == 0
