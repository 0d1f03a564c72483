"""Cancel reaches the backend: llama.cpp stops generating, as its own ``/slots`` shows.

The ``ramble`` route bans every special token, so the model never ends its answer and would
generate until its budget of thousands of tokens (over a minute on this model). A client
cancel, or a client that goes away, must close the upstream request at once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bidi_responses.bench.tiny_gguf import N_CTX
from bidi_responses.client import AsyncResponsesClient
from bidi_responses.client.stream import ConnectStream
from bidi_responses.server.core.storage.sqlite_store import Store

from tests.conftest import ServerFactory, ledger_by_id
from tests.llama.conftest import RAMBLE_BIAS, LlamaBackend, completions_route, llama_config

BUDGET = N_CTX - 512


async def _wait_backend_idle(backend: LlamaBackend) -> None:
    """Poll llama.cpp's slots until none is processing (the deadline is the caller's): the
    backend is another server, so polling its monitoring endpoint is the only way to see."""
    while True:
        if not any(slot["is_processing"] for slot in await backend.slots()):
            return
        await asyncio.sleep(0.05)


async def _start_rambling(stream: ConnectStream, *, store: bool = False) -> str:
    """Send a create on the ramble route; return its id once text is streaming."""
    response_id = ""
    events = stream.create_events(model="ramble", input="Tell me everything.", store=store)
    async for event in events:
        if event["type"] == "response.created":
            response_id = event["response"]["id"]
        if event["type"] == "response.output_text.delta":
            await events.aclose()
            return response_id
    raise AssertionError("the response ended before any text streamed")


async def test_cancel_and_client_gone_abort_the_backend_request(
    tmp_path: Path, server_factory: ServerFactory, llama_backend: LlamaBackend
) -> None:
    ramble = completions_route(
        llama_backend.base_url, max_output_tokens=BUDGET, extra_body={"logit_bias": RAMBLE_BIAS}
    )
    running = await server_factory(llama_config(tmp_path, llama_backend, ramble=ramble))
    address = f"127.0.0.1:{running.grpc_port}"
    async with asyncio.timeout(60), AsyncResponsesClient(address) as client:
        # 1. response_cancel: the response ends incomplete and the backend stops.
        async with client.connect() as stream:
            before = await llama_backend.metrics()
            cancelled = await _start_rambling(stream)
            assert any(slot["is_processing"] for slot in await llama_backend.slots())
            await stream.cancel(cancelled)
            async for event in stream.events():
                if event["type"] == "response.incomplete":
                    assert event["response"]["id"] == cancelled
                    break
            async with asyncio.timeout(10):
                await _wait_backend_idle(llama_backend)
            after = await llama_backend.metrics()
            assert after["tokens_predicted_total"] - before["tokens_predicted_total"] < BUDGET
            # The stream goes on.
            ok = await stream.create(model="tiny", input="Short answer please.", store=False)
            assert ok.output_text == "Hello world."

        # 2. The client goes away mid-generation: the same, with no cancel sent.
        stream = client.open_stream()
        gone = await _start_rambling(stream, store=True)
        stream.abort()
        async with asyncio.timeout(10):
            await _wait_backend_idle(llama_backend)
    await running.stop(grace=0)
    rows = await ledger_by_id(running)
    assert rows[cancelled].status == "cancelled"
    assert rows[gone].status == "cancelled"
    # Stored with what it had, and the documented reason for a client that went away.
    store = Store(Path(running.core.config.store_path))
    try:
        stored = await store.get(gone)
    finally:
        store.close()
    assert stored is not None
    assert stored.response["incomplete_details"] == {"reason": "client_gone"}
