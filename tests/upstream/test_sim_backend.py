"""The simulated engine in its own process (``bench.sim_backend``), served through the
production ``completions`` route.

The backend is a real process on loopback; the server under test is a real server whose
route posts token ids to it. The rollout must be the in-process sim's own (the same calls,
arguments and answer for the same settings), and the backend's prefix cache must serve each
continuation's history (its cached-token report reaches ``response.stats``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bidi_responses.bench.run.backend import SimBackendProcess
from bidi_responses.bench.sim_backend import read_prompt, sim_body
from bidi_responses.client import AgentResult, AsyncResponsesClient, run_agent_loop
from bidi_responses.schema import Item
from bidi_responses.server.config import RouteConfig, ServerConfig
from bidi_responses.server.core.rendering import tokenizer
from bidi_responses.server.core.rendering.render import Renderer
from bidi_responses.server.core.rendering.tokenizer import load_encoding
from bidi_responses.server.engine_config import CompletionsConfig

from tests.conftest import FAST_SIM, SHELL_TOOL, ServerFactory


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The backend process for the module; yields its base URL."""
    with SimBackendProcess(tmp_path_factory.mktemp("sim-backend")) as process:
        assert process.base_url is not None
        yield process.base_url


def test_the_prompt_is_read_back_as_the_core_counts_it() -> None:
    encoding = load_encoding()
    renderer = Renderer(encoding)
    items: list[Item] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "function_call", "call_id": "c2", "name": "exec_command", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c2", "output": "ok"},
    ]
    prompt = list(renderer.render_conversation("Be brief.", [SHELL_TOOL], items))
    start = [tokenizer.START, *encoding.encode_ordinary("assistant")]
    facts = read_prompt([*prompt, *start], encoding)
    assert [t.name for t in facts.tools] == ["exec_command"]
    assert facts.tool_rounds == 2 and facts.model_turns == 2
    assert facts.forced_function is None
    # A user message resets the tool rounds; a prompt that opens a call forces it.
    user: Item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "again"}],
    }
    prompt = list(renderer.render_conversation("Be brief.", [SHELL_TOOL], [*items, user]))
    header = encoding.encode_ordinary(" to=functions.exec_command")
    opened = [*start, *header, tokenizer.CHANNEL, *encoding.encode_ordinary("commentary json")]
    facts = read_prompt([*prompt, *opened, tokenizer.MESSAGE], encoding)
    assert facts.tool_rounds == 0 and facts.forced_function == "exec_command"


def _config(tmp_path: Path, base_url: str) -> ServerConfig:
    config = ServerConfig(grpc_port=0, http_port=0, data_dir=str(tmp_path / "data"))
    remote = CompletionsConfig(base_url=base_url, format="generic", extra_body=sim_body(FAST_SIM))
    config.models = {
        "sim-model": RouteConfig(engine="sim", sim=FAST_SIM),
        "sim-remote": RouteConfig(engine="completions", completions=remote),
    }
    return config


async def _rollout(address: str, model: str) -> AgentResult:
    async with AsyncResponsesClient(address) as client, client.connect() as stream:
        return await run_agent_loop(
            stream,
            model=model,
            input="List the files, then summarise.",
            tools=[SHELL_TOOL],
            functions={"exec_command": lambda args: f"ran {args.get('cmd')}: a.txt b.txt"},
            mode="chain",
        )


async def test_the_backend_plays_the_in_process_rollout(
    tmp_path: Path, server_factory: ServerFactory, backend: str
) -> None:
    async with asyncio.timeout(60):
        running = await server_factory(_config(tmp_path, backend))
        address = f"127.0.0.1:{running.grpc_port}"
        local = await _rollout(address, "sim-model")
        remote = await _rollout(address, "sim-remote")
    assert remote.final.status == "completed"
    assert len(remote.turns) == len(local.turns) == FAST_SIM.tool_rounds + 1
    for mine, theirs in zip(remote.turns, local.turns, strict=True):
        calls = [(c["name"], c["arguments"]) for c in mine.function_calls]
        assert calls == [(c["name"], c["arguments"]) for c in theirs.function_calls]
    assert remote.final.output_text == local.final.output_text
    assert remote.final.usage is not None and local.final.usage is not None
    assert remote.final.usage.output_tokens == local.final.usage.output_tokens
    # Each continuation's history was in the backend's prefix cache: only new tokens prefilled.
    for turn in remote.turns[1:]:
        stats: dict[str, Any] = dict(turn.raw.get("stats") or {})
        assert stats["engine_cached_tokens"] > 0
        assert 0 < stats["prefill_tokens"] < stats["engine_prompt_tokens"]
