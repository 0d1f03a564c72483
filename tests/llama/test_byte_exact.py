"""What a real model writes reaches the client whole, and the next prompt is the template's.

llama.cpp serves the open model (``open_gguf``: a byte-level BPE of its own, ChatML template
with tools). A recording proxy adds a per-request GBNF ``grammar``, so the model writes what
the test chose, in tokens of its own choosing:

* characters its vocabulary has no token for (``°``, ``Ł``, ``ó``, ``ź``, an emoji), so
  each is split across two to four byte tokens, and llama.cpp reports the ids of the first
  ones in no ``logprobs`` entry of their own;
* text, then a tool call after the template's ``\\n`` separator;
* a tool call whose arguments hold those characters.

Over chained turns (HTTP+SSE, WebSocket mode, gRPC) and append-mode turns (WebSocket mode,
gRPC), every prompt the server sends equals llama.cpp's own ``/apply-template`` +
``/tokenize`` of the conversation so far (the model's turns as it wrote them), every text and
argument delta is whole (no U+FFFD) and joins to what the model wrote, and ``output_tokens``
is what the backend sampled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from bidi_responses.client import AsyncResponsesClient
from bidi_responses.server.config import ServerConfig
from bidi_responses.server.engines.completions import CompletionsEngine
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ServerFactory
from tests.llama.conftest import LlamaBackend, Recorder, completions_route, llama_tokens
from tests.ws.conftest import connector

# Keys deliberately out of alphabetical order: every transport must keep the client's order.
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Météo d'une ville.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
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
INSTRUCTIONS = "Réponds brièvement."
QUESTION = "Quel temps fait-il à Łódź ?"
THANKS = "Merci !"
TOOL_OUTPUT = "Soleil, 24 °C."
# What the model writes, turn by turn (the grammar makes it).
CALL_TEXT = "Je regarde à Łódź, 24 °C 🎂."
CALL_ARGUMENTS = '{"city": "Łódź 🎂"}'
CALL_JSON = f'{{"name": "get_weather", "arguments": {CALL_ARGUMENTS}}}'
CALL = f"{CALL_TEXT}\n<tool_call>\n{CALL_JSON}\n</tool_call>"
ANSWER = "Il fait 24 °C à Łódź 🎂."
WELCOME = "De rien ! 🎂°"

Events = list[dict[str, Any]]


def gbnf(text: str) -> str:
    """A grammar whose only sentence is ``text``."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'root ::= "{escaped}"'


class Transport:
    """One client transport: a create (and, on the streams, an append) returns the turn's
    events as the WebSocket-mode JSON events, up to the terminal event or ``response.done``."""

    def __init__(
        self,
        create: Callable[..., Awaitable[Events]],
        append: Callable[[str, list[dict[str, Any]]], Awaitable[Events]] | None = None,
    ) -> None:
        self.create = create
        self.append = append


@contextlib.asynccontextmanager
async def _http(port: int) -> AsyncIterator[Transport]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/v1", timeout=30) as http:

        async def create(**body: Any) -> Events:
            body.pop("store", None)  # a chain over HTTP needs the stored response
            events: Events = []
            async with http.stream("POST", "/responses", json={**body, "stream": True}) as r:
                assert r.status_code == 200, await r.aread()
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        events.append(json.loads(line[6:]))
            return events

        yield Transport(create)


@contextlib.asynccontextmanager
async def _websocket(port: int) -> AsyncIterator[Transport]:
    async with connector(port)() as sock:

        async def create(**body: Any) -> Events:
            return await sock.create(**body)

        async def append(response_id: str, items: list[dict[str, Any]]) -> Events:
            await sock.send({"type": "response.append", "response_id": response_id, "input": items})
            return await sock.turn()

        yield Transport(create, append)


@contextlib.asynccontextmanager
async def _grpc(port: int) -> AsyncIterator[Transport]:
    async with AsyncResponsesClient(f"127.0.0.1:{port}") as client, client.connect() as stream:

        async def create(**body: Any) -> Events:
            return [event async for event in stream.create_events(**body)]

        async def append(response_id: str, items: list[dict[str, Any]]) -> Events:
            return [event async for event in stream.append_events(response_id, items)]

        yield Transport(create, append)


class Conversation:
    """The conversation as chat messages (the model's turns as it wrote them), checked
    against what the server sends and what the client receives, turn after turn."""

    def __init__(self, backend: LlamaBackend, recorder: Recorder) -> None:
        self.backend = backend
        self.recorder = recorder
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": INSTRUCTIONS}]
        self.checked = 0

    async def check_prompt(self) -> None:
        """The request the model's last segment came from is llama.cpp's own render."""
        sent = self.recorder.bodies[self.checked]["prompt"]
        assert sent == await llama_tokens(self.backend, self.messages, CHAT_TOOLS)
        self.checked += 1


def _whole(events: Events, kind: str) -> list[str]:
    """The deltas of one kind, each checked to be whole text."""
    deltas = [event["delta"] for event in events if event["type"] == kind]
    for delta in deltas:
        assert "\ufffd" not in delta, deltas
    return deltas


def _check_output(events: Events, text: str, arguments: str | None) -> dict[str, Any]:
    """The turn streamed ``text`` (then a call with ``arguments``) whole; returns the call."""
    assert events[-1]["type"] in ("response.completed", "response.done"), events[-1]["type"]
    assert "".join(_whole(events, "response.output_text.delta")) == text
    output = events[-1]["response"]["output"]
    assert output[0]["type"] == "message"
    assert output[0]["content"][0]["text"] == text
    if arguments is None:
        assert len(output) == 1
        return {}
    assert "".join(_whole(events, "response.function_call_arguments.delta")) == arguments
    call: dict[str, Any] = output[1]
    assert (call["type"], call["name"], call["arguments"]) == (
        "function_call",
        "get_weather",
        arguments,
    )
    return call


def _sampled(recorder: Recorder, segments: int) -> int:
    """Output tokens llama.cpp reported for the last ``segments`` requests."""
    return sum(usage["completion_tokens"] for usage in recorder.usages[-segments:])


async def _conversation(
    transport: Transport, conversation: Conversation, recorder: Recorder, append_mode: bool
) -> None:
    messages = conversation.messages
    common: dict[str, Any] = {
        "model": "open",
        "instructions": INSTRUCTIONS,
        "tools": [WEATHER],
        "store": False,
    }
    if append_mode:
        common["append_mode"] = True

    # The model answers a question with text, then a call.
    recorder.grammar = gbnf(CALL)
    events = await transport.create(input=QUESTION, **common)
    messages.append({"role": "user", "content": QUESTION})
    await conversation.check_prompt()
    call = _check_output(events, CALL_TEXT, CALL_ARGUMENTS)
    function = {"name": call["name"], "arguments": call["arguments"]}
    tool_call = {"id": call["call_id"], "type": "function", "function": function}
    messages.append({"role": "assistant", "content": CALL_TEXT, "tool_calls": [tool_call]})
    messages.append({"role": "tool", "tool_call_id": call["call_id"], "content": TOOL_OUTPUT})
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": TOOL_OUTPUT}

    # The tool's output: the model answers.
    recorder.grammar = gbnf(ANSWER)
    response_id = events[-1]["response"]["id"]
    if append_mode:
        assert events[-1]["type"] == "response.done"
        assert transport.append is not None
        events = await transport.append(response_id, [output])
    else:
        usage = events[-1]["response"]["usage"]
        assert usage["output_tokens"] == _sampled(recorder, 1)
        events = await transport.create(input=[output], previous_response_id=response_id, **common)
    await conversation.check_prompt()
    assert events[-1]["type"] == "response.completed", events[-1]
    assert "".join(_whole(events, "response.output_text.delta")) == ANSWER
    # In append mode the response holds the whole rollout: the answer is its last item.
    assert events[-1]["response"]["output"][-1]["content"][0]["text"] == ANSWER
    usage = events[-1]["response"]["usage"]
    assert usage["output_tokens"] == _sampled(recorder, 2 if append_mode else 1)
    messages.append({"role": "assistant", "content": ANSWER})

    # A plain chat turn after the model's own answer.
    recorder.grammar = gbnf(WELCOME)
    events = await transport.create(
        input=THANKS, previous_response_id=events[-1]["response"]["id"], **common
    )
    messages.append({"role": "user", "content": THANKS})
    await conversation.check_prompt()
    _check_output(events, WELCOME, None)
    assert events[-1]["response"]["usage"]["output_tokens"] == _sampled(recorder, 1)


@pytest.mark.parametrize(
    ("name", "append_mode"),
    [("http", False), ("websocket", False), ("websocket", True), ("grpc", False), ("grpc", True)],
)
async def test_the_model_s_bytes_reach_the_client_and_the_next_prompt_whole(
    tmp_path: Path,
    server_factory: ServerFactory,
    open_backend: LlamaBackend,
    open_model: Path,
    recorder: Recorder,
    name: str,
    append_mode: bool,
) -> None:
    route = completions_route(
        recorder.url + "/v1", format="template", tokenizer=str(open_model), max_output_tokens=256
    )
    config = ServerConfig(grpc_port=0, http_port=0, data_dir=str(tmp_path / "data"))
    config.models = {"open": route}
    running = await server_factory(config, http=True)
    assert running.http_port is not None
    opener = {"http": _http, "websocket": _websocket, "grpc": _grpc}[name]
    port = running.grpc_port if name == "grpc" else running.http_port
    conversation = Conversation(open_backend, recorder)
    async with asyncio.timeout(60), opener(port) as transport:
        await _conversation(transport, conversation, recorder, append_mode)
    assert conversation.checked == len(recorder.bodies) == 3
    # The ids of the split characters' first bytes were put back from llama.cpp's reports.
    engine = running.core.deps.router.resolve("open").engine
    assert isinstance(engine, CompletionsEngine)
    assert engine.recovered_ids > 0
    assert engine.retokenized_tokens == 0
    # And on /metrics, as many as the engine counted, under the model's alias.
    repairs = {
        sample.labels["kind"]: sample.value
        for family in text_string_to_metric_families(running.core.metrics.scrape().decode())
        for sample in family.samples
        if sample.name == "bidi_backend_token_repairs_total" and sample.labels["model"] == "open"
    }
    assert repairs == {"recovered_ids": engine.recovered_ids}


async def test_a_call_cut_by_the_output_budget_ends_incomplete(
    tmp_path: Path,
    server_factory: ServerFactory,
    open_model: Path,
    recorder: Recorder,
) -> None:
    route = completions_route(
        recorder.url + "/v1", format="template", tokenizer=str(open_model), max_output_tokens=256
    )
    config = ServerConfig(grpc_port=0, http_port=0, data_dir=str(tmp_path / "data"))
    config.models = {"open": route}
    running = await server_factory(config, http=True)
    assert running.http_port is not None
    # A long argument: 20 tokens before the end is inside it, whatever tokens the model picks
    # (its string is 40 tokens or more; what follows it, 17 at most).
    arguments = json.dumps({"city": " ".join(["Łódź 🎂"] * 3)}, ensure_ascii=False)
    call = f'{{"name": "get_weather", "arguments": {arguments}}}'
    recorder.grammar = gbnf(f"{CALL_TEXT}\n<tool_call>\n{call}\n</tool_call>")
    # Greedy: the two requests below sample the same tokens.
    body: dict[str, Any] = {
        "model": "open",
        "input": QUESTION,
        "tools": [WEATHER],
        "store": False,
        "temperature": 0,
    }
    async with asyncio.timeout(30), _websocket(running.http_port) as transport:
        whole = await transport.create(**body)
        assert whole[-1]["type"] == "response.completed"
        # The same call with a budget that ends a few tokens before the model would.
        budget = recorder.usages[-1]["completion_tokens"] - 20
        events = await transport.create(**body, max_output_tokens=budget)
    assert recorder.usages[-1]["completion_tokens"] == budget
    last = events[-1]
    assert last["type"] == "response.incomplete", last["type"]
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert "".join(_whole(events, "response.output_text.delta")) == CALL_TEXT
    item = last["response"]["output"][-1]
    assert (item["type"], item["status"]) == ("function_call", "incomplete")
    cut = "".join(_whole(events, "response.function_call_arguments.delta"))
    assert cut == item["arguments"] != arguments
    assert arguments.startswith(cut)
    assert last["response"]["usage"]["output_tokens"] == budget
