"""The script engine: JSONL replay, validation errors, pacing and prefix cache."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import tiktoken
from bidi_responses.server.core.ports import (
    Delta,
    EngineEvent,
    EngineFinish,
    EngineRequest,
    ItemEnd,
    ItemStart,
)
from bidi_responses.server.core.rendering.tokenizer import CALL, load_encoding
from bidi_responses.server.engine_config import EngineTiming
from bidi_responses.server.engines.script import ScriptEngine, ScriptError, ScriptItem, load_script

FAST = EngineTiming(tokens_per_second=1e6, ttft_ms=0, prefill_tokens_per_second=1e9)

TURNS: list[dict[str, Any]] = [
    {"output": [{"type": "function_call", "name": "exec_command", "arguments": {"cmd": "ls"}}]},
    {
        "comment": "two parallel calls, one with a fixed call id and string arguments",
        "output": [
            {"type": "function_call", "name": "read", "arguments": '{"path": "a.py"}'},
            {"type": "function_call", "name": "read", "call_id": "call_7", "arguments": "{}"},
        ],
    },
    {
        "output": [
            {"type": "message", "text": "Let me check one more thing."},
            {"type": "function_call", "name": "exec_command"},
        ]
    },
    {"output": [{"type": "message", "text": "Done: naïve café ✓ 日本語 <|call|>"}]},
]


@pytest.fixture(scope="module")
def encoding() -> tiktoken.Encoding:
    return load_encoding()


def write_script(path: Path, lines: Sequence[Any]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


@pytest.fixture
def engine(tmp_path: Path, encoding: tiktoken.Encoding) -> ScriptEngine:
    lines: list[Any] = [TURNS[0], "", TURNS[1], TURNS[2], "   ", TURNS[3]]
    return ScriptEngine(write_script(tmp_path / "turns.jsonl", lines), FAST, encoding)


async def collect(engine: ScriptEngine, turn_index: int, **fields: Any) -> list[EngineEvent]:
    fields.setdefault("prompt_tokens", list(range(300)))
    req = EngineRequest(tools=(), turn_index=turn_index, **fields)
    async with asyncio.timeout(10):
        return [event async for event in engine.generate(req)]


def summarize(events: Sequence[EngineEvent]) -> tuple[list[tuple[str, str, str, str]], str]:
    """((kind, name, call_id, text) per item, finish reason)."""
    items: list[tuple[str, str, str, str]] = []
    start: ItemStart | None = None
    text = ""
    for event in events[:-1]:
        if isinstance(event, ItemStart):
            start, text = event, ""
        elif isinstance(event, Delta):
            text += event.text
        elif isinstance(event, ItemEnd):
            assert start is not None
            items.append((start.kind, start.name, start.call_id, text))
            start = None
    finish = events[-1]
    assert isinstance(finish, EngineFinish)
    return items, finish.reason


async def test_replays_turns_in_order(engine: ScriptEngine) -> None:
    assert engine.name == "script"
    assert await collect(engine, 0) != []
    assert summarize(await collect(engine, 0)) == (
        [("function_call", "exec_command", "", json.dumps({"cmd": "ls"}))],
        "tool_calls",
    )
    assert summarize(await collect(engine, 1)) == (
        [
            ("function_call", "read", "", '{"path": "a.py"}'),
            ("function_call", "read", "call_7", "{}"),
        ],
        "tool_calls",
    )
    assert summarize(await collect(engine, 2)) == (
        [
            ("message", "", "", "Let me check one more thing."),
            ("function_call", "exec_command", "", "{}"),
        ],
        "tool_calls",
    )
    last = ([("message", "", "", "Done: naïve café ✓ 日本語 <|call|>")], "stop")
    assert summarize(await collect(engine, 3)) == last
    # Past the end, the last line repeats.
    assert summarize(await collect(engine, 10)) == last


async def test_tokens_match_the_text(engine: ScriptEngine, encoding: tiktoken.Encoding) -> None:
    events = await collect(engine, 3)
    tokens = [t for e in events if isinstance(e, Delta) for t in e.token_ids]
    text = TURNS[3]["output"][0]["text"]
    assert tokens == encoding.encode_ordinary(text)
    assert CALL not in tokens  # special-token text in a script stays plain text
    finish = events[-1]
    assert isinstance(finish, EngineFinish)
    assert finish.output_tokens == len(tokens)
    assert finish.extra["script_turn"] == 3


async def test_prefix_cache_and_truncation(engine: ScriptEngine) -> None:
    first = (await collect(engine, 0, prompt_tokens=list(range(256))))[-1]
    second = (await collect(engine, 1, prompt_tokens=list(range(300))))[-1]
    assert isinstance(first, EngineFinish) and isinstance(second, EngineFinish)
    assert first.prefill_tokens == 256
    assert second.prefill_tokens == 300 - 256
    events = await collect(engine, 2, max_output_tokens=3)
    items, reason = summarize(events)
    assert reason == "max_output_tokens"
    assert [kind for kind, *_ in items] == ["message"]  # the call never started
    assert events[-1] == EngineFinish(
        reason="max_output_tokens",
        output_tokens=3,
        prefill_tokens=44,  # the same prompt again: its 4 whole blocks are cached
        engine_seconds=FAST.modeled_seconds(44, 3),
        extra={"prompt_tokens": 300, "cached_prompt_tokens": 256, "script_turn": 2},
    )


async def test_paced_like_sim(tmp_path: Path, encoding: tiktoken.Encoding) -> None:
    timing = EngineTiming(tokens_per_second=4000, ttft_ms=10, prefill_tokens_per_second=100_000)
    path = write_script(tmp_path / "t.jsonl", [TURNS[3]])
    engine = ScriptEngine(path, timing, encoding)
    loop = asyncio.get_running_loop()
    started = loop.time()
    events = await collect(engine, 0, prompt_tokens=list(range(1000)))
    elapsed = loop.time() - started
    finish = events[-1]
    assert isinstance(finish, EngineFinish)
    assert finish.engine_seconds == timing.modeled_seconds(1000, finish.output_tokens)
    assert elapsed >= finish.engine_seconds - 0.002


def test_load_script_items(tmp_path: Path) -> None:
    turns = load_script(write_script(tmp_path / "s.jsonl", TURNS))
    assert turns[1][1] == ScriptItem("function_call", "{}", name="read", call_id="call_7")
    assert turns[2][1] == ScriptItem("function_call", "{}", name="exec_command")


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ({"outputs": []}, "unknown field(s) ['outputs']"),
        ({"output": []}, "field 'output' must be a non-empty list"),
        ({"output": "hi"}, "field 'output'"),
        ({"output": [3]}, "output[0]: an item must be a JSON object"),
        ({"output": [{"type": "text", "text": "x"}]}, "output[0]: field 'type'"),
        ({"output": [{"type": "message"}]}, "field 'text' must be a string"),
        ({"output": [{"type": "message", "text": "x", "name": "y"}]}, "unknown field(s) ['name']"),
        ({"output": [{"type": "function_call", "name": ""}]}, "field 'name'"),
        ({"output": [{"type": "function_call", "name": "f", "arguments": 3}]}, "'arguments'"),
        ({"output": [{"type": "function_call", "name": "f", "call_id": 1}]}, "'call_id'"),
        (
            {"output": [{"type": "message", "text": "ok"}, {"type": "function_call"}]},
            "output[1]: field 'name'",
        ),
    ],
)
def test_validation_errors_name_line_and_field(
    tmp_path: Path, encoding: tiktoken.Encoding, line: Any, fragment: str
) -> None:
    path = write_script(tmp_path / "bad.jsonl", [TURNS[0], "", line])
    with pytest.raises(ScriptError) as info:
        ScriptEngine(path, FAST, encoding)
    message = str(info.value)
    assert f"{path}:3:" in message
    assert fragment in message


def test_missing_and_empty_files(tmp_path: Path, encoding: tiktoken.Encoding) -> None:
    with pytest.raises(ScriptError, match="does not exist"):
        ScriptEngine(tmp_path / "nope.jsonl", FAST, encoding)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ScriptError, match="no turns"):
        ScriptEngine(empty, FAST, encoding)
    assert issubclass(ScriptError, ValueError)


async def test_cancellation_stops_promptly(tmp_path: Path, encoding: tiktoken.Encoding) -> None:
    path = write_script(
        tmp_path / "slow.jsonl", [{"output": [{"type": "message", "text": "word " * 200}]}]
    )
    engine = ScriptEngine(path, EngineTiming(tokens_per_second=10, ttft_ms=0), encoding)
    started = asyncio.Event()
    count = 0

    async def consume() -> None:
        nonlocal count
        async for event in engine.generate(EngineRequest(prompt_tokens=[], tools=())):
            count += 1
            if isinstance(event, Delta):
                started.set()

    task = asyncio.create_task(consume())
    async with asyncio.timeout(5):
        await started.wait()
    seen = count
    task.cancel()
    async with asyncio.timeout(1):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert count == seen
