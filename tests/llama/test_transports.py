"""Real inference on every transport: the official openai SDK over HTTP+SSE and WebSocket
mode, on the llama.cpp-backed route, chained in WebSocket mode."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai

from tests.conftest import ServerFactory
from tests.llama.conftest import LlamaBackend, llama_config


async def test_openai_sdk_over_http_and_websocket(
    tmp_path: Path, server_factory: ServerFactory, llama_backend: LlamaBackend
) -> None:
    running = await server_factory(llama_config(tmp_path, llama_backend), http=True)
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{running.http_port}/v1", api_key="test", max_retries=0
    )
    try:
        async with asyncio.timeout(60):
            response = await client.responses.create(model="tiny", input="Say hello.")
            assert response.output_text == "Hello world."
            async with client.responses.connect() as conn:
                previous = None
                for turn in range(3):
                    await conn.response.create(
                        model="tiny",
                        input=f"Turn {turn}.",
                        previous_response_id=previous,
                        store=False,
                    )
                    async for event in conn:
                        if event.type == "response.completed":
                            break
                        assert event.type != "error", event
                    assert event.response.output_text == "Hello world."
                    previous = event.response.id
    finally:
        await client.close()
