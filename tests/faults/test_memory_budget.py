"""One memory budget across every stream's cache, counted in real bytes, evicting the least
recently used entry of any stream; an evicted continuation falls back to the store or gets
``previous_response_not_found``."""

from __future__ import annotations

import asyncio
import contextlib
import tracemalloc
from pathlib import Path

import orjson
import pytest
from bidi_responses.client import AsyncResponsesClient, ResponsesError
from bidi_responses.server.app import RunningServer
from bidi_responses.server.core.conversation.state import object_bytes

from tests.conftest import ServerFactory, make_config, until
from tests.workload import tool_output

TEXT = tool_output(8_000, seed=1)  # ~32 KB of code and logs


def test_item_bytes_are_real_bytes() -> None:
    raw = orjson.dumps(
        [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": TEXT}]},
            *(
                {"type": "function_call_output", "call_id": f"call_{n}", "output": TEXT[n:]}
                for n in range(50)
            ),
        ]
    )
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        items = orjson.loads(raw)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    counted = sum(object_bytes(item) for item in items)
    # Within a few percent of what the allocator really holds (the old count, 2 bytes per
    # character, would be about half of it for ASCII text, and ignore the containers).
    assert 0.9 * held <= counted <= 1.3 * held, (counted, held)


async def test_the_budget_holds_across_streams_and_evicts_the_least_recent(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    async with asyncio.timeout(60):
        config = make_config(tmp_path)
        config.cache.global_max_bytes = 512 * 1024
        running: RunningServer = await server_factory(config)
        core = running.core
        async with (
            AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client,
            contextlib.AsyncExitStack() as open_streams,
        ):
            streams = [await open_streams.enter_async_context(client.connect()) for _ in range(12)]
            warm = []
            for n, stream in enumerate(streams):
                warm.append(
                    await stream.create(
                        model="sim-model",
                        input=f"{n} {TEXT}",
                        generate=False,
                        store=n % 2 == 1,
                    )
                )
                assert core.deps.cache_budget.used <= config.cache.global_max_bytes
            stats = await client.stats()
            assert stats["cache"]["evictions"] > 0
            assert 0 < stats["cache"]["bytes_used"] <= config.cache.global_max_bytes
            # The least recently used went first: stream 0 (store: false) is gone...
            with pytest.raises(ResponsesError) as missing:
                await streams[0].create(
                    model="sim-model", previous_response_id=warm[0].id, input="next"
                )
            assert missing.value.code == "previous_response_not_found"
            # ...stream 1 stored its response: the continuation falls back to the store.
            again = await streams[1].create(
                model="sim-model", previous_response_id=warm[1].id, input="next"
            )
            assert again.status == "completed" and again.stats["tokens_reused"] == 0
            # The most recent stream still continues from its cache.
            last = await streams[-1].create(
                model="sim-model", previous_response_id=warm[-1].id, input="next"
            )
            assert last.stats["tokens_reused"] > 0
        await until(lambda: core.sessions_open == 0)
        assert core.deps.cache_budget.used == 0  # closed streams give their bytes back
