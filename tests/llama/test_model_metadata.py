"""A model's metadata read as llama.cpp reads it: a GGUF whose pre-tokenizer is named
``gpt-2`` (llama.cpp's own spelling) and whose tokenizer adds BOS, served by llama.cpp.

The route's prompt, turn after turn, equals llama.cpp's own ``/apply-template`` then
``/tokenize`` with its special tokens added (BOS, which the ChatML template does not write),
and a model file the route cannot read names the route, the file and the field.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from bidi_responses.server.app import StartupError, start_server
from bidi_responses.server.config import ServerConfig
from bidi_responses.server.core.rendering.tokenizer import load_encoding
from bidi_responses.server.engines.model_tokenizer import load_model_tokenizer
from bidi_responses.server.engines.template_format import TemplateSettings, build_template_format

from tests.conftest import ServerFactory
from tests.llama.conftest import LlamaBackend, completions_route, serving
from tests.llama.open_gguf import write_open_model


@pytest.fixture(scope="module")
def bos_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bos-model") / "bos.gguf"
    return write_open_model(path, pre="gpt-2", add_bos=True)


@pytest.fixture(scope="module")
def bos_backend(bos_model: Path) -> Iterator[LlamaBackend]:
    with serving(bos_model, n_ctx=2048, jinja=True) as backend:
        yield backend


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def _llama_chat_tokens(backend: LlamaBackend, messages: list[dict[str, Any]]) -> list[int]:
    """llama.cpp's chat path: its template's render, tokenized with the model's specials."""
    async with httpx.AsyncClient(timeout=10) as client:
        body = {"messages": messages, "add_generation_prompt": True}
        prompt = (await client.post(backend.url + "/apply-template", json=body)).json()["prompt"]
        tokens = await client.post(
            backend.url + "/tokenize",
            json={"content": prompt, "add_special": True, "parse_special": True},
        )
    ids: list[int] = tokens.json()["tokens"]
    return ids


async def test_a_gpt_2_bos_model_gets_llama_cpp_s_prompt(
    tmp_path: Path, server_factory: ServerFactory, bos_backend: LlamaBackend, bos_model: Path
) -> None:
    model = load_model_tokenizer(bos_model)
    text = "Weather in Zürich, 東京 and Paris? 123456 it's\t\n\n  ok 🎂"
    async with httpx.AsyncClient(timeout=10) as client:
        reply = await client.post(
            bos_backend.url + "/tokenize",
            json={"content": text, "add_special": False, "parse_special": True},
        )
    theirs = reply.json()["tokens"]
    assert model.encode(text) == theirs
    route = completions_route(bos_backend.base_url, format="template", tokenizer=str(bos_model))
    config = ServerConfig(grpc_port=0, http_port=0, data_dir=str(tmp_path / "data"))
    config.models = {"bos": route}
    running = await server_factory(config, http=True)
    messages: list[dict[str, Any]] = []
    items: list[Any] = []
    fmt = build_template_format(TemplateSettings(str(bos_model)), load_encoding())
    previous: str | None = None
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{running.http_port}/v1", timeout=30
    ) as http:
        for question in ["Hello?", "Paris?"]:
            messages.append({"role": "user", "content": question})
            body = {
                "model": "bos",
                "input": question,
                "previous_response_id": previous,
                "tool_choice": "none",  # the model answers in text (its call token banned)
            }
            async with asyncio.timeout(30):
                response = (await http.post("/responses", json=body)).json()
            assert response["status"] == "completed", response
            expected = await _llama_chat_tokens(bos_backend, messages)
            assert expected[0] == model.token_id(model.bos_token)
            assert response["stats"]["engine_prompt_tokens"] == len(expected)
            # The route's render of the same conversation, token for token (bos once).
            items.append(_user(question))
            rendered = fmt.renderer.render_conversation(None, [], items)
            assert [*rendered, *fmt.assistant_start] == expected
            [answer] = response["output"]
            items.append(answer)
            text = answer["content"][0]["text"]
            messages.append({"role": "assistant", "content": text})
            previous = response["id"]


async def test_a_route_whose_model_cannot_be_read_names_route_file_and_field(
    tmp_path: Path,
) -> None:
    # The server stops at start-up (every route is built then): one line for the operator.
    path = write_open_model(tmp_path / "odd.gguf", pre="made-up")
    route = completions_route("http://127.0.0.1:9/v1", format="template", tokenizer=str(path))
    config = ServerConfig(grpc_port=0, http_port=0, data_dir=str(tmp_path / "data"))
    config.models = {"odd": route}
    with pytest.raises(StartupError) as failed:
        async with asyncio.timeout(30):
            await start_server(config)
    message = str(failed.value)
    assert "model 'odd'" in message
    assert str(path) in message
    assert "tokenizer.ggml.pre is 'made-up'" in message
