"""Codex CLI's traffic, replayed from the recorded shapes, against examples/codex-shell-once.jsonl.

Codex itself is not installed here; these tests send what it was recorded sending: over
WebSocket a generate:false prewarm, a continuation with the rest of the input, then only the
function_call_output; over HTTP the full history on every POST. They check what it needs
back: ``response.output_item.done`` for each item and ``response.completed`` with an id.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from bidi_responses.server.app import RunningServer
from bidi_responses.server.config import RouteConfig

from tests.conftest import FAST_SIM, ServerFactory, make_config
from tests.http.conftest import parse_sse
from tests.ws.conftest import connector, final

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "codex-shell-once.jsonl"

EXEC_COMMAND: dict[str, Any] = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command in a PTY, returning output or a session ID.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {
            "cmd": {"type": "string", "description": "Shell command to execute."},
            "workdir": {"type": "string"},
            "shell": {"type": "string"},
            "tty": {"type": "boolean"},
            "login": {"type": "boolean"},
            "yield_time_ms": {"type": "number"},
            "max_output_tokens": {"type": "number"},
            "sandbox_permissions": {"type": "string", "enum": ["use_default", "require_escalated"]},
            "justification": {"type": "string"},
            "prefix_rule": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["cmd"],
        "additionalProperties": False,
    },
}
TOOLS: list[dict[str, Any]] = [EXEC_COMMAND, {"type": "web_search"}]


def codex_body(**fields: Any) -> dict[str, Any]:
    """The fields Codex repeats in every request."""
    return {
        "model": "sim-model",
        "stream": True,
        "tools": TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "01a22693-0000-4000-8000-000000000000",
        "client_metadata": {"turn_id": ""},
        **fields,
    }


def message(role: str, text: str) -> dict[str, Any]:
    """An input message as Codex sends it (with a client-made id)."""
    return {
        "type": "message",
        "id": f"msg_{uuid.uuid4().hex}",
        "role": role,
        "content": [{"type": "input_text", "text": text}],
    }


BASE = [message("developer", "<base instructions> " * 200)]
PROMPT = [
    message("developer", "<permissions>"),
    message("user", "<environment_context>"),
    message("user", "say hi"),
]
SHELL_OUTPUT = (
    "Chunk ID: f27d5d\nWall time: 0.1474 seconds\nProcess exited with code 0\n"
    "Original token count: 1\nOutput:\nhi\n"
)


@pytest.fixture
async def script_server(server_factory: ServerFactory, tmp_path: Path) -> RunningServer:
    """The server with 'sim-model' replaying the example script."""
    config = make_config(tmp_path)
    config.models["sim-model"] = RouteConfig(engine="script", sim=FAST_SIM, script_path=str(SCRIPT))
    running: RunningServer = await server_factory(config, http=True)
    return running


def items_done(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The complete items Codex collects from response.output_item.done."""
    return [e["item"] for e in events if e["type"] == "response.output_item.done"]


async def test_codex_websocket_run(script_server: RunningServer) -> None:
    assert script_server.http_port is not None
    connect = connector(script_server.http_port)
    headers = {
        "Authorization": "Bearer sim-key",
        "OpenAI-Beta": "responses_websockets=2026-02-06",
        "originator": "codex_exec",
        "x-client-request-id": str(uuid.uuid4()),
    }
    async with asyncio.timeout(20), connect(additional_headers=headers) as sock:
        prewarm = await sock.create(**codex_body(generate=False, input=BASE))
        assert [e["type"] for e in prewarm] == ["response.created", "response.completed"]
        warm = final(prewarm)

        turn = await sock.create(**codex_body(previous_response_id=warm["id"], input=PROMPT))
        assert turn[-1]["type"] == "response.completed"
        (call,) = items_done(turn)
        assert call["type"] == "function_call"
        assert call["name"] == "exec_command"
        assert orjson.loads(call["arguments"]) == {"cmd": "echo hi"}
        assert call["call_id"]

        # Only the tool output: the server has the call from the previous response.
        answer = await sock.create(
            **codex_body(
                previous_response_id=final(turn)["id"],
                input=[
                    {
                        "type": "function_call_output",
                        "id": f"fco_{uuid.uuid4().hex}",
                        "call_id": call["call_id"],
                        "output": SHELL_OUTPUT,
                    }
                ],
            )
        )
        assert answer[-1]["type"] == "response.completed"
        (reply,) = items_done(answer)
        assert reply["content"][0]["text"] == "done"
        usage = final(answer)["usage"]
        assert usage["input_tokens_details"]["cached_tokens"] > 0


async def test_codex_http_run_sends_full_history(script_server: RunningServer) -> None:
    async with (
        asyncio.timeout(20),
        httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{script_server.http_port}/v1",
            headers={"accept": "text/event-stream"},
        ) as http,
    ):
        history = BASE + PROMPT
        reply = await http.post("/responses", json=codex_body(input=history))
        events = parse_sse(reply.content)
        assert events[-1]["type"] == "response.completed"
        (call,) = items_done(events)

        # Codex echoes the call (here with a made-up id) before its output.
        echoed = {**call, "id": f"fc_{uuid.uuid4().hex}"}
        history = [
            *history,
            echoed,
            {"type": "function_call_output", "call_id": call["call_id"], "output": SHELL_OUTPUT},
        ]
        events = parse_sse((await http.post("/responses", json=codex_body(input=history))).content)
        assert events[-1]["type"] == "response.completed"
        (reply_item,) = items_done(events)
        assert reply_item["content"][0]["text"] == "done"
