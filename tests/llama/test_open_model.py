"""An open model behind the stream, against llama.cpp itself.

llama.cpp serves a tiny model with its own byte-level BPE vocabulary and a Qwen-style chat
template with tools (``open_gguf``). The route reads the model's tokenizer and template from
the same GGUF file. A recording proxy between the server and llama.cpp keeps every request
the server sends. Over a multi-turn tool conversation (official ``openai`` SDK, WebSocket
mode) the test checks, turn after turn:

* the token ids sent equal llama.cpp's own ``/apply-template`` then ``/tokenize`` of the same
  messages and tools;
* the model's ``<tool_call>`` arrives as a function call whose arguments stream as
  ``response.function_call_arguments.delta`` events;
* ``cached_tokens`` is the prefix the previous context shares with the new prompt, recomputed
  from llama.cpp's own render;
* the backend prefilled only the new tokens: its prefix cache served the whole previous
  prompt, and its own counters agree.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import httpx
import openai
from bidi_responses.server.config import ServerConfig
from bidi_responses.server.core.rendering.tokenizer import load_encoding
from bidi_responses.server.engines.model_tokenizer import load_model_tokenizer
from bidi_responses.server.engines.template_format import TemplateSettings, build_template_format

from tests.conftest import ServerFactory
from tests.llama.conftest import LlamaBackend, Recorder, completions_route, llama_tokens
from tests.llama.open_gguf import ANSWER, CALL_ARGUMENTS

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather of a city, now.",
    # Keys deliberately out of alphabetical order: the prompt keeps the client's order.
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "Ville, e.g. Zürich"}},
        "required": ["city"],
    },
}
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": WEATHER["name"],
            "description": WEATHER["description"],
            "parameters": WEATHER["parameters"],
        },
    }
]
INSTRUCTIONS = "Be brief."


def _stats(response: openai.types.responses.Response) -> dict[str, int]:
    """The server's ``stats`` on the response (a field the SDK does not know)."""
    stats: dict[str, int] = (response.model_extra or {})["stats"]
    return stats


def _dump(response: openai.types.responses.Response) -> list[dict[str, Any]]:
    return [item.model_dump(exclude_none=True) for item in response.output]


def _shared(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


async def _turn(conn: Any, **create: Any) -> tuple[openai.types.responses.Response, list[str]]:
    """One turn on a WebSocket-mode connection: the completed response and its argument
    deltas."""
    await conn.response.create(store=False, **create)
    deltas: list[str] = []
    async for event in conn:
        assert event.type != "error", event
        if event.type == "response.function_call_arguments.delta":
            deltas.append(event.delta)
        if event.type in ("response.completed", "response.failed", "response.incomplete"):
            return event.response, deltas
    raise AssertionError("the connection closed before the response ended")


async def test_tool_conversation_sends_llama_cpps_own_tokens_turn_after_turn(
    tmp_path: Path,
    server_factory: ServerFactory,
    open_backend: LlamaBackend,
    open_model: Path,
    recorder: Recorder,
) -> None:
    route = completions_route(recorder.url + "/v1", format="template", tokenizer=str(open_model))
    config = ServerConfig(grpc_port=0, http_port=0, data_dir=str(tmp_path / "data"))
    config.models = {"open": route}
    running = await server_factory(config, http=True)
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{running.http_port}/v1", api_key="test", max_retries=0
    )
    messages: list[dict[str, Any]] = [{"role": "system", "content": INSTRUCTIONS}]
    # (new input items, chat messages they are, tool_choice, whether the model calls)
    questions = ["What is the weather in Paris?", "And tomorrow?"]
    previous: str | None = None
    # The previous response's whole context (prompt and output, as the next prompt renders
    # it), from a fresh render of every item: what cached_tokens is measured against.
    renderer = build_template_format(TemplateSettings(str(open_model)), load_encoding()).renderer
    items: list[dict[str, Any]] = []

    def context(items: list[dict[str, Any]]) -> list[int]:
        return list(renderer.render_conversation(INSTRUCTIONS, [WEATHER], cast(Any, items)))

    previous_context: list[int] = []
    previous_prompt: list[int] = []
    try:
        async with asyncio.timeout(90), client.responses.connect() as conn:
            for question in questions:
                # A user turn: the model calls the tool.
                user = {"role": "user", "content": question}
                response, deltas = await _turn(
                    conn,
                    model="open",
                    instructions=INSTRUCTIONS,
                    tools=[WEATHER],
                    input=question,
                    previous_response_id=previous,
                )
                assert response.status == "completed", response.error
                [call] = [item for item in response.output if item.type == "function_call"]
                assert (call.name, call.arguments) == ("get_weather", CALL_ARGUMENTS)
                assert "".join(deltas) == CALL_ARGUMENTS
                messages.append(user)
                await _check_turn(open_backend, recorder, response, messages, previous_context)
                previous_prompt = recorder.bodies[-1]["prompt"]
                function = {"name": call.name, "arguments": call.arguments}
                tool_call = {"id": call.call_id, "type": "function", "function": function}
                messages.append({"role": "assistant", "content": "", "tool_calls": [tool_call]})
                text = [{"type": "input_text", "text": question}]
                items += [{"type": "message", "role": "user", "content": text}, *_dump(response)]
                previous_context = context(items)
                previous = response.id

                # The tool's output: the model may not call again, it answers.
                output = {"type": "function_call_output", "call_id": call.call_id}
                output["output"] = "Sunny, 21 °C."
                before = await open_backend.metrics()
                response, _ = await _turn(
                    conn,
                    model="open",
                    instructions=INSTRUCTIONS,
                    tools=[WEATHER],
                    tool_choice="none",
                    input=[output],
                    previous_response_id=previous,
                )
                assert response.status == "completed", response.error
                assert response.output_text == ANSWER
                messages.append(
                    {"role": "tool", "tool_call_id": call.call_id, "content": output["output"]}
                )
                await _check_turn(open_backend, recorder, response, messages, previous_context)
                # The backend kept the whole previous prompt: only the new tokens were
                # prefilled (the sampled call is rendered anew, as with any real model).
                stats = _stats(response)
                assert stats["engine_cached_tokens"] >= len(previous_prompt)
                # Seen from llama.cpp's own counters too.
                prefilled = (await open_backend.metrics())["prompt_tokens_total"]
                prefilled -= before["prompt_tokens_total"]
                assert prefilled == stats["engine_prompt_tokens"] - stats["engine_cached_tokens"]
                assert prefilled <= len(recorder.bodies[-1]["prompt"]) - len(previous_prompt)
                messages.append({"role": "assistant", "content": ANSWER})
                items += [output, *_dump(response)]
                previous_context = context(items)
                previous = response.id
        async with httpx.AsyncClient() as http:
            stats = (await http.get(f"http://127.0.0.1:{running.http_port}/v1/stats")).json()
        assert stats["cache"]["prompt_rerenders"] == 0  # ChatML keeps earlier turns as they were
    finally:
        await client.close()
    assert len(recorder.bodies) == 4


async def _check_turn(
    backend: LlamaBackend,
    recorder: Recorder,
    response: openai.types.responses.Response,
    messages: list[dict[str, Any]],
    previous_context: list[int],
) -> None:
    sent = recorder.bodies[-1]["prompt"]
    expected = await llama_tokens(backend, messages, CHAT_TOOLS)
    assert sent == expected
    usage = response.usage
    assert usage is not None
    assert usage.input_tokens_details.cached_tokens == _shared(previous_context, expected)
    # ChatML keeps earlier turns as they were: the whole previous context is reused.
    assert usage.input_tokens_details.cached_tokens == len(previous_context)
    assert _stats(response)["engine_prompt_tokens"] == len(sent)


def test_the_gguf_vocabulary_tokenizes_as_llama_cpp_does(
    open_backend: LlamaBackend, open_model: Path
) -> None:
    tokenizer = load_model_tokenizer(open_model)
    text = (
        "<|im_start|>user\nWeather in Zürich, 東京 and Paris? 123456 it's\t\n\n  ok<|im_end|>\n"
        '<tool_call>\n{"name": "x"}\n</tool_call>'
    )
    tokens = httpx.post(
        open_backend.url + "/tokenize",
        json={"content": text, "add_special": False, "parse_special": True},
        timeout=10,
    ).json()["tokens"]
    assert tokenizer.encode(text) == tokens
    assert json.dumps(tokenizer.encode(text)) == json.dumps(tokens)
