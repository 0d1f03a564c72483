"""A backend that is down, slow or answers garbage: a clear ``response.failed``, the stream
goes on, and every response keeps its ledger row."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bidi_responses.client import AsyncResponsesClient
from bidi_responses.server.engines.completions import CompletionsEngine

from tests.conftest import ServerFactory, ledger_by_id
from tests.llama.bad_backends import TEXT_ONLY_TOKENS, bad_backends, closed_port
from tests.llama.conftest import LlamaBackend, completions_route, llama_config

# model -> (error code, requests the backend should see: retries only before any token)
CASES = {
    "down": ("engine_unavailable", None),
    "busy": ("engine_unavailable", 3),
    "slow": ("engine_timeout", 1),
    "garbage": ("engine_bad_response", 1),
    "html": ("engine_bad_response", 1),
    # Caught before sending: the prompt cannot fit the route's context window.
    "tight": ("context_length_exceeded", 0),
}


async def test_bad_backends_fail_cleanly_and_the_stream_goes_on(
    tmp_path: Path, server_factory: ServerFactory, llama_backend: LlamaBackend
) -> None:
    async with asyncio.timeout(60), bad_backends() as bad:
        routes = {
            mode: completions_route(
                bad.base_url(mode), first_token_timeout_s=0.5, idle_timeout_s=0.5, max_retries=2
            )
            for mode in [*CASES, "text_only"]
            if mode != "down"
        }
        routes["tight"] = completions_route(bad.base_url("tight"), context_window=4)
        routes["down"] = completions_route(
            f"http://127.0.0.1:{closed_port()}/v1", max_retries=1, connect_timeout_s=1.0
        )
        running = await server_factory(llama_config(tmp_path, llama_backend, **routes))
        ids: list[str] = []
        address = f"127.0.0.1:{running.grpc_port}"
        async with AsyncResponsesClient(address) as client, client.connect() as stream:
            for model, (code, requests) in CASES.items():
                response = await stream.create(model=model, input="hi", store=False)
                assert response.status == "failed", model
                assert response.error is not None
                assert response.error["code"] == code, (model, response.error)
                assert response.error["message"], model
                if requests is not None:
                    assert bad.requests[model] == requests, model
                ids.append(response.id)
            # Text without ids (no logprobs) is tokenized back, counted, and charged as the
            # backend counted it.
            text = await stream.create(model="text_only", input="hi", store=False)
            assert (text.status, text.output_text) == ("completed", "Hello world."), text.error
            assert text.usage is not None
            assert text.usage.output_tokens == TEXT_ONLY_TOKENS
            engine = running.core.deps.router.resolve("text_only").engine
            assert isinstance(engine, CompletionsEngine)
            assert engine.retokenized_tokens == TEXT_ONLY_TOKENS
            ids.append(text.id)
            # The same stream still serves the real model.
            ok = await stream.create(model="tiny", input="hi again", store=False)
            assert ok.status == "completed"
            assert ok.output_text == "Hello world."
            ids.append(ok.id)
        await running.stop(grace=0)
    rows = await ledger_by_id(running)
    assert set(ids) <= set(rows)
    assert [rows[i].status for i in ids] == ["failed"] * len(CASES) + ["completed"] * 2
    assert rows[ids[-1]].output_tokens > 0
