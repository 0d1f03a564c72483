"""The token path end to end: a chained loop on one Connect stream, served by llama.cpp.

Each turn sends only its new input; the server appends the new items' tokens to the stream's
cached render and sends the backend the whole prompt as token ids. From the backend's own
reports (the stream's usage chunk and its Prometheus counters) the test checks that the prompt
grows by exactly the turn's new tokens, and that the backend's prefix cache served everything
it had seen before, so it prefilled only the new tokens.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bidi_responses.client import AsyncResponsesClient
from bidi_responses.schema import FunctionCallOutputItem, Item, MessageItem
from bidi_responses.server.core.rendering.render import Renderer
from bidi_responses.server.core.rendering.tokenizer import load_encoding
from bidi_responses.server.engines.format_choice import build_format

from tests.conftest import ServerFactory
from tests.llama.conftest import LlamaBackend, completions_route, llama_config

TURNS = 10
ASSISTANT_START = 2  # <|start|>assistant, which the engine appends to every prompt


def _user(n: int) -> MessageItem:
    return {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": f"Step {n}: check the build log and go on."}],
    }


async def test_ten_turn_chain_sends_only_new_tokens(
    tmp_path: Path, server_factory: ServerFactory, llama_backend: LlamaBackend
) -> None:
    running = await server_factory(llama_config(tmp_path, llama_backend))
    renderer = Renderer(load_encoding())
    instructions = "You are a careful build engineer."
    conversation: list[Item] = []
    prompts: list[int] = []
    cached: list[int] = []
    prefilled: list[float] = []
    address = f"127.0.0.1:{running.grpc_port}"
    async with (
        asyncio.timeout(60),
        AsyncResponsesClient(address) as client,
        client.connect() as stream,
    ):
        previous: str | None = None
        for turn in range(TURNS):
            new_input = [_user(turn)]
            before = await llama_backend.metrics()
            response = await stream.create(
                model="tiny",
                instructions=instructions,
                input=new_input,
                previous_response_id=previous,
                store=False,
            )
            after = await llama_backend.metrics()
            assert response.status == "completed", response.error
            # The model's fixed answer came back through token ids and the parser.
            assert response.output_text == "Hello world."
            stats = response.stats
            conversation += new_input
            expected = renderer.render_conversation(instructions, [], conversation)
            assert stats["engine_prompt_tokens"] == len(expected) + ASSISTANT_START
            prompts.append(stats["engine_prompt_tokens"])
            cached.append(stats["engine_cached_tokens"])
            prefilled.append(after["prompt_tokens_total"] - before["prompt_tokens_total"])
            if turn:
                # The API side rendered only the new items: the previous turn's
                # output and this turn's input.
                assert stats["tokens_reused"] > 0
                assert stats["tokens_rendered"] < 100
            conversation += response.output
            previous = response.id

    for turn in range(1, TURNS):
        new_items = conversation[2 * turn - 1 : 2 * turn + 1]  # previous output, new input
        new_tokens = len(renderer.render_conversation(None, [], new_items))
        # The prompt grows by exactly the new tokens...
        assert prompts[turn] - prompts[turn - 1] == new_tokens, turn
        # ...and the backend served all it had seen from its cache, and more each turn.
        assert cached[turn] > cached[turn - 1]
        assert cached[turn] >= prompts[turn - 1]
        # Seen from the backend's counters: it prefilled only what its cache did not have.
        assert prefilled[turn] == prompts[turn] - cached[turn]


SHELL = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}


async def test_harmony_route_renders_gpt_oss_prompts_and_calls_tools(
    tmp_path: Path, server_factory: ServerFactory, llama_backend: LlamaBackend
) -> None:
    harmony = completions_route(llama_backend.base_url, format="harmony")
    running = await server_factory(llama_config(tmp_path, llama_backend, harmony=harmony))
    renderer = build_format("harmony", load_encoding()).renderer
    instructions = "Use the shell."
    conversation: list[Item] = []
    address = f"127.0.0.1:{running.grpc_port}"
    async with (
        asyncio.timeout(60),
        AsyncResponsesClient(address) as client,
        client.connect() as stream,
    ):
        # A forced tool choice: the prompt opens the call and the model writes its arguments.
        first = await stream.create(
            model="harmony",
            instructions=instructions,
            tools=[SHELL],
            tool_choice={"type": "function", "name": "exec_command"},
            input=[_user(0)],
            store=False,
        )
        assert first.status == "completed", first.error
        [call] = first.function_calls
        assert call["name"] == "exec_command"
        assert call["arguments"] == "Hello world."
        conversation += [_user(0), *first.output]
        output: FunctionCallOutputItem = {
            "type": "function_call_output",
            "call_id": call["call_id"],
            "output": "ok",
        }
        second = await stream.create(
            model="harmony",
            instructions=instructions,
            tools=[SHELL],
            input=[output],
            previous_response_id=first.id,
            store=False,
        )
        assert second.output_text == "Hello world."
        conversation.append(output)
    # The second prompt is exactly openai-harmony's render of the conversation, and the
    # backend reused the first turn's tokens from its cache.
    expected = renderer.render_conversation(instructions, [SHELL], conversation)
    assert second.stats["engine_prompt_tokens"] == len(expected) + ASSISTANT_START
    assert second.stats["engine_cached_tokens"] >= first.stats["engine_prompt_tokens"]
