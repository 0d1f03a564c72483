"""A gpt-oss turn end to end, from recorded Harmony token streams served the way vLLM streams
them (``token_ids`` per chunk): reasoning and a tool call become items on the Connect stream,
the tool output goes back, and each prompt is exactly ``openai-harmony``'s render."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bidi_responses.client import AsyncResponsesClient
from bidi_responses.schema import FunctionCallOutputItem, Item
from bidi_responses.server.config import ServerConfig
from bidi_responses.server.core.rendering import tokenizer
from bidi_responses.server.core.rendering.tokenizer import load_encoding
from bidi_responses.server.engines.format_choice import build_format
from bidi_responses.server.engines.harmony import load_harmony

from tests.conftest import SHELL_TOOL, ServerFactory
from tests.engines.test_formats import ANSWER, TOOL_CALL
from tests.llama.bad_backends import bad_backends
from tests.llama.conftest import completions_route


async def test_recorded_gpt_oss_tool_turn_through_the_stream(
    tmp_path: Path, server_factory: ServerFactory
) -> None:
    harmony = load_harmony()
    renderer = build_format("harmony", load_encoding()).renderer
    async with asyncio.timeout(30), bad_backends() as backend:
        backend.replies = [
            harmony.encode(TOOL_CALL, allowed_special="all"),
            harmony.encode(ANSWER, allowed_special="all"),
        ]
        backend.cached_tokens = 7
        config = ServerConfig(grpc_port=0, http_port=0, data_dir=str(tmp_path / "data"))
        config.models = {"gpt-oss": completions_route(backend.base_url("replay"), format="harmony")}
        running = await server_factory(config)
        address = f"127.0.0.1:{running.grpc_port}"
        async with AsyncResponsesClient(address) as client, client.connect() as stream:
            user = {"type": "message", "role": "user", "content": "List the files."}
            first = await stream.create(model="gpt-oss", tools=[SHELL_TOOL], input=[user])
            assert first.status == "completed", first.error
            reasoning, call = first.output
            assert reasoning["type"] == "reasoning"
            assert reasoning["summary"][0]["text"] == (
                "The user wants the files listed. Use exec_command."
            )
            assert call["type"] == "function_call"
            assert call["name"] == "exec_command"
            assert call["arguments"] == '{"cmd":"ls -la","workdir":"/tmp"}'
            assert first.stats["engine_cached_tokens"] == 7
            output: FunctionCallOutputItem = {
                "type": "function_call_output",
                "call_id": call["call_id"],
                "output": "a b",
            }
            second = await stream.create(
                model="gpt-oss", tools=[SHELL_TOOL], input=[output], previous_response_id=first.id
            )
            assert second.output_text == "Two files: a.txt and b.txt."
    start = [tokenizer.START, *load_encoding().encode_ordinary("assistant")]
    user_item: Item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "List the files."}],
    }
    conversation: list[Item] = [user_item, *first.output, output]
    # The client sends schemas as JSON text by default: the keys in the caller's order.
    tool = SHELL_TOOL
    first_prompt = renderer.render_conversation(None, [tool], [user_item])
    second_prompt = renderer.render_conversation(None, [tool], conversation)
    assert backend.prompts == [[*first_prompt, *start], [*second_prompt, *start]]
