"""A SentencePiece model read from its GGUF alone, against llama.cpp serving the same file.

The vocabulary (pieces, scores, byte fallback), BOS and the chat template all come from the
GGUF (``open_gguf.write_sentencepiece_model``). The route tokenizes as llama.cpp does, its
prompts equal llama.cpp's own ``/apply-template`` + ``/tokenize`` turn after turn, and text the
model writes in byte-fallback tokens (characters the pieces lack) reaches the client whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from bidi_responses.server.config import ServerConfig
from bidi_responses.server.engines.model_tokenizer import load_model_tokenizer

from tests.conftest import ServerFactory
from tests.llama.conftest import LlamaBackend, completions_route, recording_proxy, serving
from tests.llama.open_gguf import write_sentencepiece_model
from tests.llama.test_byte_exact import gbnf
from tests.ws.conftest import connector

ANSWERS = ["Il fait 24 °C à Łódź 🎂.", "De rien ! Ünïcödé 東京 ok"]


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sentencepiece_model(tmp_path_factory.mktemp("spm") / "spm.gguf")


@pytest.fixture(scope="module")
def spm_backend(spm_model: Path) -> Iterator[LlamaBackend]:
    with serving(spm_model, n_ctx=2048, jinja=True) as backend:
        yield backend


async def _tokenize(backend: LlamaBackend, text: str, *, special: bool) -> list[int]:
    async with httpx.AsyncClient(timeout=10) as client:
        reply = await client.post(
            backend.url + "/tokenize",
            json={"content": text, "add_special": special, "parse_special": True},
        )
    ids: list[int] = reply.json()["tokens"]
    return ids


async def test_the_gguf_s_sentencepiece_vocabulary_tokenizes_as_llama_cpp_does(
    spm_backend: LlamaBackend, spm_model: Path
) -> None:
    model = load_model_tokenizer(spm_model)
    for text in [
        "<|im_start|>user\nWeather in Zürich, 東京 and Paris? 123456 it's\t\n\n  ok 🎂<|im_end|>\n",
        "Hello  world",
        " lead",
        '<tool_call>\n{"name": "x"}\n</tool_call>',
    ]:
        assert model.encode(text) == await _tokenize(spm_backend, text, special=False), text


async def test_a_sentencepiece_conversation_gets_llama_cpp_s_prompts(
    tmp_path: Path, server_factory: ServerFactory, spm_backend: LlamaBackend, spm_model: Path
) -> None:
    async with recording_proxy(spm_backend) as recorder:
        route = completions_route(recorder.url + "/v1", format="template", tokenizer=str(spm_model))
        config = ServerConfig(grpc_port=0, http_port=0, data_dir=str(tmp_path / "data"))
        config.models = {"spm": route}
        running = await server_factory(config, http=True)
        assert running.http_port is not None
        messages: list[dict[str, Any]] = []
        previous: str | None = None
        async with asyncio.timeout(60), connector(running.http_port)() as sock:
            for turn, answer in enumerate(ANSWERS):
                question = f"Question {turn} ?"
                recorder.grammar = gbnf(answer)
                events = await sock.create(
                    model="spm", input=question, previous_response_id=previous, store=False
                )
                messages.append({"role": "user", "content": question})
                async with httpx.AsyncClient(timeout=10) as client:
                    body = {"messages": messages, "add_generation_prompt": True}
                    reply = await client.post(spm_backend.url + "/apply-template", json=body)
                # llama.cpp's chat path adds the BOS its tokenizer asks for.
                expected = await _tokenize(spm_backend, reply.json()["prompt"], special=True)
                assert recorder.bodies[-1]["prompt"] == expected
                assert expected[0] == 1  # <s>
                last = events[-1]
                assert last["type"] == "response.completed", last
                deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
                assert all("\ufffd" not in delta for delta in deltas)
                assert "".join(deltas) == answer
                sampled = recorder.usages[-1]["completion_tokens"]
                assert last["response"]["usage"]["output_tokens"] == sampled
                messages.append({"role": "assistant", "content": answer})
                previous = last["response"]["id"]
