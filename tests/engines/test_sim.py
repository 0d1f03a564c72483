"""The simulated engine, its schema-instance generator, pacing and prefix cache."""

from __future__ import annotations

import array
import asyncio
import gc
import json
import math
import random
import re
import threading
import time
import tracemalloc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import tiktoken
from bidi_responses.server.core.ports import (
    Delta,
    Engine,
    EngineEvent,
    EngineFinish,
    EngineRequest,
    FunctionSpec,
    ItemEnd,
    ItemStart,
)
from bidi_responses.server.core.rendering.tokenizer import load_encoding
from bidi_responses.server.engine_config import EngineTiming, SimConfig
from bidi_responses.server.engines import build_engine
from bidi_responses.server.engines.prefix_cache import PrefixCache
from bidi_responses.server.engines.schema_sampler import schema_instance
from bidi_responses.server.engines.script import ScriptEngine
from bidi_responses.server.engines.sim import PREFIX_BLOCK_BYTES, SimEngine
from bidi_responses.server.engines.timing import (
    OFFLOAD_PROMPT_TOKENS,
    Pacer,
    PlannedItem,
    play,
    token_deltas,
)

from tests.conftest import SHELL_TOOL

# Fast settings for most tests: no base latency, effectively instant decoding.
FAST: dict[str, Any] = {
    "tokens_per_second": 1e6,
    "ttft_ms": 0.0,
    "prefill_tokens_per_second": 1e9,
}

# The shell tool the live-server tests use, as the engine sees it.
EXEC_COMMAND = FunctionSpec("exec_command", SHELL_TOOL["parameters"])

KITCHEN_SINK = FunctionSpec(
    "kitchen_sink",
    {
        "type": "object",
        "$defs": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "properties": {
            "mode": {"enum": ["fast", "slow", 3, None]},
            "version": {"const": "v1"},
            "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "step": {"type": "integer", "minimum": 10, "maximum": 50, "multipleOf": 5},
            "negative": {"type": "integer", "maximum": -5},
            "flag": {"type": "boolean"},
            "code": {"type": "string", "minLength": 5, "maxLength": 8},
            "when": {"type": "string", "format": "date-time"},
            "id": {"type": "string", "format": "uuid"},
            "maybe": {"type": ["string", "null"]},
            "origin": {"$ref": "#/$defs/point"},
            "either": {"anyOf": [{"type": "integer", "minimum": 100}, {"type": "null"}]},
            "both": {
                "allOf": [
                    {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                    {"properties": {"b": {"type": "boolean"}}, "required": ["b"]},
                ]
            },
            "tags": {
                "type": "array",
                "items": {"type": "string", "enum": ["a", "b", "c", "d", "e"]},
                "minItems": 2,
                "maxItems": 4,
                "uniqueItems": True,
            },
            "points": {"type": "array", "items": {"$ref": "#/$defs/point"}, "minItems": 1},
            "nested": {
                "type": "object",
                "properties": {
                    "deep": {
                        "type": "object",
                        "properties": {"note": {"type": "string", "maxLength": 12}},
                        "required": ["note"],
                    }
                },
                "required": ["deep"],
                "additionalProperties": False,
            },
            "text": {"type": "string", "maxLength": 60},
        },
        "required": ["mode", "version", "ratio", "step", "code", "origin", "tags", "nested"],
        "additionalProperties": False,
    },
)

DRAFT4 = FunctionSpec(
    "draft4",
    {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0, "maximum": 3, "exclusiveMinimum": True},
            "x": {"type": "number", "minimum": 0, "maximum": 0.05, "exclusiveMaximum": True},
            "pair": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}]},
        },
        "required": ["n", "x", "pair"],
    },
)

NO_ARGS = FunctionSpec(
    "no_args", {"type": "object", "properties": {}, "additionalProperties": False}
)


# ---------------------------------------------------------------------------------------------
# A small JSON-schema checker covering what the generator claims to support (jsonschema is not
# a dependency of the project).


def schema_errors(instance: Any, schema: Any, root: Any = None, path: str = "$") -> list[str]:
    """Violations of ``schema`` by ``instance`` (empty when valid)."""
    root = schema if root is None else root
    if schema is True or schema == {}:
        return []
    if schema is False:
        return [f"{path}: false schema"]
    while "$ref" in schema:
        target = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            target = target[part]
        schema = {**{k: v for k, v in schema.items() if k != "$ref"}, **target}
    errors: list[str] = []
    if "const" in schema and instance != schema["const"]:
        errors.append(f"{path}: != const {schema['const']!r}")
    if "enum" in schema and instance not in schema["enum"]:
        errors.append(f"{path}: {instance!r} not in enum")
    for key in ("anyOf", "oneOf"):
        if key in schema and all(schema_errors(instance, s, root, path) for s in schema[key]):
            errors.append(f"{path}: matches no {key} option")
    for sub in schema.get("allOf", []):
        errors += schema_errors(instance, sub, root, path)
    types = schema.get("type")
    if types is not None:
        types = types if isinstance(types, list) else [types]
        checks = {
            "object": lambda v: isinstance(v, dict),
            "array": lambda v: isinstance(v, list),
            "string": lambda v: isinstance(v, str),
            "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
            "boolean": lambda v: isinstance(v, bool),
            "null": lambda v: v is None,
        }
        if not any(checks[t](instance) for t in types):
            return [*errors, f"{path}: {instance!r} is not of type {types}"]
    if isinstance(instance, dict):
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in instance:
                errors.append(f"{path}: missing required {name!r}")
        extra = schema.get("additionalProperties", True)
        for name, value in instance.items():
            if name in props:
                errors += schema_errors(value, props[name], root, f"{path}.{name}")
            elif extra is False:
                errors.append(f"{path}: additional property {name!r}")
            elif isinstance(extra, dict):
                errors += schema_errors(value, extra, root, f"{path}.{name}")
        if len(instance) < schema.get("minProperties", 0):
            errors.append(f"{path}: fewer than minProperties")
    if isinstance(instance, list):
        items = schema.get("items", {})
        prefix = schema.get("prefixItems", [])
        if isinstance(items, list):
            prefix, items = items, schema.get("additionalItems", {})
        for i, value in enumerate(instance):
            sub = prefix[i] if i < len(prefix) else items
            errors += schema_errors(value, sub, root, f"{path}[{i}]")
        if len(instance) < schema.get("minItems", 0):
            errors.append(f"{path}: fewer than minItems")
        if len(instance) > schema.get("maxItems", math.inf):
            errors.append(f"{path}: more than maxItems")
        keys = [json.dumps(v, sort_keys=True) for v in instance]
        if schema.get("uniqueItems") and len(set(keys)) != len(keys):
            errors.append(f"{path}: items not unique")
    if isinstance(instance, str):
        if len(instance) < schema.get("minLength", 0):
            errors.append(f"{path}: shorter than minLength")
        if len(instance) > schema.get("maxLength", math.inf):
            errors.append(f"{path}: longer than maxLength")
        formats = {
            "date-time": r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ",
            "uuid": r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
        }
        fmt = schema.get("format")
        if fmt in formats and not re.fullmatch(formats[fmt], instance):
            errors.append(f"{path}: not a {fmt}")
    if isinstance(instance, int | float) and not isinstance(instance, bool):
        low, high = schema.get("minimum"), schema.get("maximum")
        ex_low, ex_high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
        if low is not None and (instance < low or (ex_low is True and instance == low)):
            errors.append(f"{path}: below minimum")
        if high is not None and (instance > high or (ex_high is True and instance == high)):
            errors.append(f"{path}: above maximum")
        if not isinstance(ex_low, bool) and ex_low is not None and instance <= ex_low:
            errors.append(f"{path}: not above exclusiveMinimum")
        if not isinstance(ex_high, bool) and ex_high is not None and instance >= ex_high:
            errors.append(f"{path}: not below exclusiveMaximum")
        step = schema.get("multipleOf")
        if step is not None and abs(instance / step - round(instance / step)) > 1e-9:
            errors.append(f"{path}: not a multiple of {step}")
    return errors


def test_checker_catches_violations() -> None:
    schema = KITCHEN_SINK.parameters
    assert schema_errors({"mode": "other"}, schema)
    assert schema_errors(json.loads('{"cmd": 1}'), EXEC_COMMAND.parameters)
    assert schema_errors({"cmd": "x", "bogus": 1}, EXEC_COMMAND.parameters)
    assert not schema_errors({"cmd": "x", "timeout_ms": 5}, EXEC_COMMAND.parameters)


# ---------------------------------------------------------------------------------------------
# Helpers


@pytest.fixture(scope="module")
def encoding() -> tiktoken.Encoding:
    return load_encoding()


def request(**overrides: Any) -> EngineRequest:
    fields: dict[str, Any] = {"prompt_tokens": list(range(1000)), "tools": (EXEC_COMMAND,)}
    fields.update(overrides)
    return EngineRequest(**fields)


async def collect(engine: Engine, req: EngineRequest) -> list[EngineEvent]:
    async with asyncio.timeout(10):
        return [event async for event in engine.generate(req)]


def finish_of(events: Sequence[EngineEvent]) -> EngineFinish:
    last = events[-1]
    assert isinstance(last, EngineFinish)
    assert not any(isinstance(e, EngineFinish) for e in events[:-1])
    return last


def items_of(events: Sequence[EngineEvent]) -> list[tuple[ItemStart, str, list[int]]]:
    """(start, text, token ids) per item, checking the event grammar on the way."""
    items: list[tuple[ItemStart, str, list[int]]] = []
    current: tuple[ItemStart, list[str], list[int]] | None = None
    for event in events[:-1]:
        if isinstance(event, ItemStart):
            assert current is None, "ItemStart inside an item"
            current = (event, [], [])
        elif isinstance(event, Delta):
            assert current is not None, "Delta outside an item"
            current[1].append(event.text)
            current[2].extend(event.token_ids)
        elif isinstance(event, ItemEnd):
            assert current is not None, "ItemEnd outside an item"
            items.append((current[0], "".join(current[1]), current[2]))
            current = None
    assert current is None, "item not closed"
    return items


def sim(encoding: tiktoken.Encoding, **config: Any) -> SimEngine:
    return SimEngine(SimConfig(**{**FAST, **config}), encoding)


# ---------------------------------------------------------------------------------------------
# Behaviour


async def test_function_call_arguments_are_valid_and_sized(encoding: tiktoken.Encoding) -> None:
    engine = sim(encoding, function_call_tokens=40)
    events = await collect(engine, request())
    finish = finish_of(events)
    [(start, text, tokens)] = items_of(events)
    assert start == ItemStart(kind="function_call", name="exec_command", call_id="")
    assert finish.reason == "tool_calls"
    assert not schema_errors(json.loads(text), EXEC_COMMAND.parameters)
    assert text.isascii()
    # Each Delta's text is its own tokens' text (at this rate the engine is always ahead of
    # the loop, so it hands over merged Deltas), and together they make the exact JSON string.
    deltas = [e for e in events if isinstance(e, Delta)]
    assert all(d.text == encoding.decode(list(d.token_ids)) for d in deltas)
    assert tokens == encoding.encode_ordinary(text)
    assert 40 <= len(tokens) <= 48
    assert finish.output_tokens == len(tokens)


@pytest.mark.parametrize(
    "tool", [EXEC_COMMAND, KITCHEN_SINK, DRAFT4, NO_ARGS], ids=lambda t: t.name
)
def test_generated_arguments_validate(encoding: tiktoken.Encoding, tool: FunctionSpec) -> None:
    engine = sim(encoding)
    for seed in range(150):
        text = engine.arguments_for(tool.parameters, random.Random(seed))
        errors = schema_errors(json.loads(text), tool.parameters)
        assert not errors, (seed, text, errors)
        assert text.isascii()


def test_optional_properties_vary(encoding: tiktoken.Encoding) -> None:
    seen: set[frozenset[str]] = set()
    for seed in range(50):
        seen.add(frozenset(schema_instance(EXEC_COMMAND.parameters, random.Random(seed))))
    assert frozenset({"cmd"}) in seen
    assert frozenset({"cmd", "workdir", "timeout_ms"}) in seen


def test_padding_respects_max_length(encoding: tiktoken.Encoding) -> None:
    tool = FunctionSpec(
        "short",
        {
            "type": "object",
            "properties": {"q": {"type": "string", "maxLength": 10}},
            "required": ["q"],
        },
    )
    engine = sim(encoding, function_call_tokens=200)
    text = engine.arguments_for(tool.parameters, random.Random(1))
    assert len(json.loads(text)["q"]) <= 10


async def test_deterministic_for_same_seed(encoding: tiktoken.Encoding) -> None:
    tools = (EXEC_COMMAND, KITCHEN_SINK, DRAFT4)
    runs = []
    for _ in range(2):
        engine = sim(encoding, seed=7)  # fresh engine: same prefix-cache state too
        runs.append([await collect(engine, request(tools=tools, tool_rounds=r)) for r in range(4)])
    # The same items, texts and tokens; how they are cut into Deltas depends on how late the
    # consumer was (merged when late), so only the content is compared.
    assert [[items_of(events) for events in run] for run in runs] == [
        [items_of(events) for events in runs[0]]
    ] * 2
    assert [[finish_of(events).output_tokens for events in run] for run in runs] == [
        [finish_of(events).output_tokens for events in runs[0]]
    ] * 2


async def test_different_seeds_differ(encoding: tiktoken.Encoding) -> None:
    tools = (EXEC_COMMAND, KITCHEN_SINK)

    async def texts(config_seed: int, request_seed: int, rounds: int) -> list[str]:
        engine = sim(encoding, seed=config_seed)
        events = await collect(engine, request(tools=tools, seed=request_seed, tool_rounds=rounds))
        return [text for _, text, _ in items_of(events)]

    for rounds in (0, 3):  # a tool call and a text answer
        base = await texts(0, 0, rounds)
        assert await texts(1, 0, rounds) != base
        assert await texts(0, 1, rounds) != base
        assert await texts(0, 0, rounds) == base


async def test_turn_index_changes_output(encoding: tiktoken.Encoding) -> None:
    engine = sim(encoding)
    a = items_of(await collect(engine, request(turn_index=0)))
    b = items_of(await collect(engine, request(turn_index=1)))
    assert a[0][1] != b[0][1]


async def test_tool_rounds_respected(encoding: tiktoken.Encoding) -> None:
    engine = sim(encoding, tool_rounds=2, answer_tokens=50)
    kinds = []
    for rounds in range(4):
        events = await collect(engine, request(tool_rounds=rounds, turn_index=rounds))
        [(start, _, _)] = items_of(events)
        kinds.append((start.kind, finish_of(events).reason))
    assert kinds == [
        ("function_call", "tool_calls"),
        ("function_call", "tool_calls"),
        ("message", "stop"),
        ("message", "stop"),
    ]


@pytest.mark.parametrize(
    ("overrides", "kind"),
    [
        ({"tool_choice": "none"}, "message"),
        ({"tools": ()}, "message"),
        ({"tool_choice": "required", "tool_rounds": 9}, "function_call"),
        ({"forced_function": "no_args", "tool_rounds": 9}, "function_call"),
    ],
)
async def test_tool_choice(
    encoding: tiktoken.Encoding, overrides: dict[str, Any], kind: str
) -> None:
    engine = sim(encoding, tool_rounds=3)
    req = request(**{"tools": (EXEC_COMMAND, NO_ARGS), **overrides})
    [(start, text, _)] = items_of(await collect(engine, req))
    assert start.kind == kind
    if overrides.get("forced_function"):
        assert start.name == "no_args" and text == "{}"


async def test_forced_function_must_exist(encoding: tiktoken.Encoding) -> None:
    engine = sim(encoding)
    with pytest.raises(ValueError, match="nope"):
        await collect(engine, request(forced_function="nope"))


async def test_answer_is_text_of_configured_length(encoding: tiktoken.Encoding) -> None:
    engine = sim(encoding, answer_tokens=300, tool_rounds=0)
    events = await collect(engine, request())
    [(start, text, tokens)] = items_of(events)
    assert start.kind == "message"
    assert len(tokens) == 300 == finish_of(events).output_tokens
    assert text.isascii() and len(text.split()) > 50
    assert encoding.decode(tokens) == text


async def test_long_answer_wraps_corpus(encoding: tiktoken.Encoding) -> None:
    engine = sim(encoding, answer_tokens=5000, tool_rounds=0)
    events = await collect(engine, request())
    assert finish_of(events).output_tokens == 5000


@pytest.mark.parametrize("tool_rounds", [0, 5])
async def test_max_output_tokens_truncates(encoding: tiktoken.Encoding, tool_rounds: int) -> None:
    engine = sim(encoding, tool_rounds=3)
    events = await collect(engine, request(max_output_tokens=7, tool_rounds=tool_rounds))
    finish = finish_of(events)
    [(_, _, tokens)] = items_of(events)
    assert finish.reason == "max_output_tokens"
    assert len(tokens) == 7 == finish.output_tokens


async def test_max_output_tokens_zero(encoding: tiktoken.Encoding) -> None:
    engine = sim(encoding)
    events = await collect(engine, request(max_output_tokens=0))
    assert len(events) == 1
    assert finish_of(events).reason == "max_output_tokens"
    assert finish_of(events).output_tokens == 0


async def test_max_output_tokens_not_hit(encoding: tiktoken.Encoding) -> None:
    engine = sim(encoding, answer_tokens=20, tool_rounds=0)
    events = await collect(engine, request(max_output_tokens=20))
    assert finish_of(events).reason == "stop"


# ---------------------------------------------------------------------------------------------
# Prefix cache


async def test_prefix_cache_charges_only_new_tokens(encoding: tiktoken.Encoding) -> None:
    engine = sim(encoding, prefix_block_tokens=64)
    history = list(range(1000))
    first = finish_of(await collect(engine, request(prompt_tokens=history)))
    assert first.prefill_tokens == 1000
    assert first.extra["cached_prompt_tokens"] == 0
    extended = [*history, *range(5000, 5300)]
    second = finish_of(await collect(engine, request(prompt_tokens=extended, turn_index=1)))
    # 15 whole blocks (960 tokens) were seen; the 40-token tail and the new 300 are charged.
    assert second.prefill_tokens == 1300 - 960
    assert second.extra == {"prompt_tokens": 1300, "cached_prompt_tokens": 960}
    # The cache belongs to the engine instance: another engine starts cold.
    other = finish_of(await collect(sim(encoding), request(prompt_tokens=extended)))
    assert other.prefill_tokens == 1300


async def test_prefix_cache_accepts_arrays(encoding: tiktoken.Encoding) -> None:
    engine = sim(encoding)
    await collect(engine, request(prompt_tokens=list(range(640))))
    prompt = array.array("I", range(700))
    finish = finish_of(await collect(engine, request(prompt_tokens=prompt)))
    assert finish.prefill_tokens == 60


def test_prefix_cache_blocks() -> None:
    cache = PrefixCache(block_tokens=4, max_blocks=100)
    assert cache.match_and_insert([]) == 0
    assert cache.match_and_insert([1, 2, 3]) == 0  # no whole block: nothing cached
    assert len(cache) == 0
    assert cache.match_and_insert(list(range(10))) == 0
    assert len(cache) == 2
    assert cache.match_and_insert(list(range(10))) == 8
    assert cache.match_and_insert(array.array("I", range(12))) == 8
    assert cache.match_and_insert(list(range(12))) == 12
    # A change inside block 1 invalidates it and everything after it.
    changed = list(range(12))
    changed[5] = 99
    assert cache.match_and_insert(changed) == 4
    # Same tokens at another position do not hit: the hashes are chained.
    assert cache.match_and_insert([4, 5, 6, 7]) == 0
    cache.clear()
    assert cache.match_and_insert(list(range(12))) == 0


def test_prefix_cache_evicts_tails_first() -> None:
    cache = PrefixCache(block_tokens=2, max_blocks=6)
    a = list(range(8))  # 4 blocks
    b = list(range(100, 108))  # 4 blocks
    cache.match_and_insert(a)
    cache.match_and_insert(b)
    assert len(cache) == 6
    # a's two last blocks were evicted, its head survived.
    assert cache.match_and_insert(a) == 4
    assert len(cache) == 6


def test_prefix_cache_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError):
        PrefixCache(block_tokens=0)
    with pytest.raises(ValueError):
        PrefixCache(max_blocks=-1)


def test_prefix_cache_is_fast_for_long_prompts() -> None:
    rng = random.Random(0)
    prompt = [rng.randrange(200_000) for _ in range(200_000)]
    cache = PrefixCache()
    start = time.perf_counter()
    assert cache.match_and_insert(prompt) == 0
    assert cache.match_and_insert(array.array("I", prompt + [1] * 100)) == 200_000 // 64 * 64
    # Generous bound (a few ms each on a normal machine) that still catches quadratic code.
    assert time.perf_counter() - start < 1.0


# ---------------------------------------------------------------------------------------------
# Timing


@pytest.mark.parametrize("tps", [65, 1000, 4000])
async def test_engine_seconds_is_modeled_time(encoding: tiktoken.Encoding, tps: float) -> None:
    engine = sim(encoding, tokens_per_second=tps, ttft_ms=5, prefill_tokens_per_second=100_000)
    prompt = list(range(500))
    loop = asyncio.get_running_loop()
    started = loop.time()
    events = await collect(engine, request(prompt_tokens=prompt, max_output_tokens=3))
    elapsed = loop.time() - started
    finish = finish_of(events)
    assert finish.output_tokens == 3
    expected = 0.005 + 500 / 100_000 + 3 / tps
    assert finish.engine_seconds == pytest.approx(expected, rel=1e-12)
    assert finish.engine_seconds == EngineTiming(tps, 5, 100_000).modeled_seconds(500, 3)
    # The stream really was paced (the loop may only be late, never early).
    assert elapsed >= expected - 0.002


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="tokens_per_second"):
        SimConfig(tokens_per_second=0)
    with pytest.raises(ValueError, match="ttft_ms"):
        SimConfig(ttft_ms=-1)
    with pytest.raises(ValueError, match="answer_tokens"):
        SimConfig(answer_tokens=-1)
    with pytest.raises(ValueError, match="prefill"):
        EngineTiming(prefill_tokens_per_second=math.inf)


async def test_pacer_sleeps_only_when_ahead() -> None:
    now = [100.0]
    sleeps: list[float] = []

    async def fake_sleep(delay: float) -> None:
        sleeps.append(delay)
        now[0] += delay

    timing = EngineTiming(tokens_per_second=100, ttft_ms=50, prefill_tokens_per_second=1000)
    pacer = Pacer(timing, 50, clock=lambda: now[0], sleep=fake_sleep, yield_every=4)
    await pacer.advance()  # due at 100 + 0.05 + 0.05 + 0.01
    assert sleeps == [pytest.approx(0.11)]
    now[0] += 0.505  # the loop was late: tokens 2..51 are now overdue
    sleeps.clear()
    for _ in range(50):
        await pacer.advance()
    # Overdue tokens go back to back, with only a zero-length yield every 4 tokens...
    assert sleeps == [0] * 12
    # ...and once caught up, it sleeps again, exactly until the next token is due.
    await pacer.advance()
    assert sleeps[-1] == pytest.approx(0.005)
    assert pacer.tokens == 52
    # Modeled time ignores the loop's lateness.
    assert pacer.modeled_seconds() == pytest.approx(0.1 + 52 / 100)


async def _played_late(
    late_by_s: float, max_output_tokens: int | None = None
) -> tuple[list[EngineEvent], float]:
    """Ten one-token deltas at 100 tok/s, consumed on time except once: after the first delta
    the consumer comes back ``late_by_s`` late. The events and the fake clock's end."""
    now = [0.0]

    async def fake_sleep(delay: float) -> None:
        now[0] += delay

    planned = tuple(Delta(text=f"t{i} ", token_ids=(i,)) for i in range(10))
    received: list[EngineEvent] = []
    async for event in play(
        [PlannedItem(kind="message", deltas=planned)],
        request=EngineRequest(prompt_tokens=[], tools=(), max_output_tokens=max_output_tokens),
        timing=EngineTiming(tokens_per_second=100, ttft_ms=0),
        prefix_cache=PrefixCache(),
        finish_reason="stop",
        clock=lambda: now[0],
        sleep=fake_sleep,
    ):
        received.append(event)
        if isinstance(event, Delta) and event.token_ids == (0,):
            now[0] += late_by_s
    return received, now[0]


async def test_a_late_consumer_gets_what_was_generated_meanwhile_as_one_delta() -> None:
    # Token k (0-based) is due at (k + 1) / 100 s. Back at 0.055 s, tokens 1-4 are due.
    events, end = await _played_late(0.045)
    deltas = [event for event in events if isinstance(event, Delta)]
    assert [d.token_ids for d in deltas] == [(0,), (1, 2, 3, 4), (5,), (6,), (7,), (8,), (9,)]
    assert deltas[1].text == "t1 t2 t3 t4 "
    assert "".join(d.text for d in deltas) == "".join(f"t{i} " for i in range(10))
    finish = finish_of(events)
    assert finish.output_tokens == 10 and finish.reason == "stop"
    # Nothing is released early: the schedule, not the merge, sets the end.
    assert end == pytest.approx(0.1) and finish.engine_seconds == pytest.approx(0.1)


async def test_an_on_time_consumer_gets_each_planned_delta() -> None:
    events, _ = await _played_late(0.0)
    deltas = [event for event in events if isinstance(event, Delta)]
    assert [d.token_ids for d in deltas] == [(i,) for i in range(10)]


async def test_a_merged_delta_stays_within_the_output_budget() -> None:
    events, _ = await _played_late(0.09, max_output_tokens=3)
    deltas = [event for event in events if isinstance(event, Delta)]
    assert [d.token_ids for d in deltas] == [(0,), (1, 2)]
    assert events[-2] == ItemEnd(incomplete=True)
    finish = finish_of(events)
    assert finish.reason == "max_output_tokens" and finish.output_tokens == 3


async def test_play_zero_token_item_waits_ttft() -> None:
    now = [0.0]

    async def fake_sleep(delay: float) -> None:
        now[0] += delay

    items = [PlannedItem(kind="message", deltas=())]
    req = EngineRequest(prompt_tokens=[], tools=())
    events = [
        event
        async for event in play(
            items,
            request=req,
            timing=EngineTiming(ttft_ms=50),
            prefix_cache=PrefixCache(),
            finish_reason="stop",
            clock=lambda: now[0],
            sleep=fake_sleep,
        )
    ]
    assert events[:2] == [ItemStart(kind="message"), ItemEnd()]
    assert now[0] == pytest.approx(0.05)
    assert finish_of(events).engine_seconds == pytest.approx(0.05)


class _ThreadRecordingCache(PrefixCache):
    """A prefix cache that records which thread hashed each prompt."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[threading.Thread] = []

    def match_and_insert(self, prompt_tokens: Sequence[int]) -> int:
        self.threads.append(threading.current_thread())
        return super().match_and_insert(prompt_tokens)


async def test_a_huge_prompt_is_hashed_off_the_event_loop() -> None:
    """Every other stream waits while the loop hashes: a huge prompt goes to a worker thread,
    a small one stays inline; both are charged the same way."""
    now = [0.0]

    async def fake_sleep(delay: float) -> None:
        now[0] += delay

    cache = _ThreadRecordingCache()
    items = [PlannedItem(kind="message", deltas=())]
    for size in (OFFLOAD_PROMPT_TOKENS, OFFLOAD_PROMPT_TOKENS, 100):
        request = EngineRequest(prompt_tokens=array.array("I", range(size)), tools=())
        events = [
            event
            async for event in play(
                items,
                request=request,
                timing=EngineTiming(ttft_ms=0),
                prefix_cache=cache,
                finish_reason="stop",
                clock=lambda: now[0],
                sleep=fake_sleep,
            )
        ]
        assert isinstance(events[-1], EngineFinish)
    main = threading.current_thread()
    assert [thread is main for thread in cache.threads] == [False, False, True]
    # The same blocks whichever thread hashed: the repeat and the short prefix added none.
    assert len(cache) == OFFLOAD_PROMPT_TOKENS // cache.block_tokens


def test_token_deltas_keep_characters_whole(encoding: tiktoken.Encoding) -> None:
    text = "naïve 日本語 \U0001f600 ok"
    tokens = encoding.encode_ordinary(text)
    deltas = token_deltas(encoding, tokens)
    assert "".join(d.text for d in deltas) == text
    assert [t for d in deltas for t in d.token_ids] == tokens
    assert all("\ufffd" not in d.text for d in deltas)


async def test_cancellation_stops_generate_promptly(encoding: tiktoken.Encoding) -> None:
    # 20 tokens/s: the answer would take 10 s, so only cancellation can end it quickly.
    engine = sim(encoding, tokens_per_second=20, tool_rounds=0)
    received: list[EngineEvent] = []
    first_delta = asyncio.Event()

    async def consume() -> None:
        async for event in engine.generate(request()):
            received.append(event)
            if isinstance(event, Delta):
                first_delta.set()

    task = asyncio.create_task(consume())
    async with asyncio.timeout(5):
        await first_delta.wait()
    count = len(received)
    task.cancel()
    async with asyncio.timeout(1):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert task.cancelled()
    assert len(received) == count
    assert not any(isinstance(e, EngineFinish) for e in received)


async def test_concurrent_streams_share_the_loop(encoding: tiktoken.Encoding) -> None:
    engine = sim(encoding, tokens_per_second=5000, tool_rounds=0, answer_tokens=50)
    results = await asyncio.gather(
        *(collect(engine, request(seed=i, prompt_tokens=list(range(i, i + 700)))) for i in range(8))
    )
    assert all(finish_of(events).output_tokens == 50 for events in results)


# ---------------------------------------------------------------------------------------------
# build_engine


def test_build_engine(encoding: tiktoken.Encoding, tmp_path: Path) -> None:
    engine = build_engine("sim", sim_config=SimConfig(**FAST), encoding=encoding)
    assert isinstance(engine, SimEngine) and engine.name == "sim"
    script = tmp_path / "turns.jsonl"
    script.write_text('{"output": [{"type": "message", "text": "hi"}]}\n')
    config = SimConfig(tokens_per_second=123, prefix_block_tokens=16)
    engine = build_engine("script", sim_config=config, script_path=script, encoding=encoding)
    assert isinstance(engine, ScriptEngine) and engine.name == "script"
    assert engine.timing.tokens_per_second == 123
    assert engine.prefix_cache.block_tokens == 16
    with pytest.raises(ValueError, match="script_path"):
        build_engine("script", encoding=encoding)
    with pytest.raises(ValueError, match="unknown engine"):
        build_engine("vllm", encoding=encoding)


def test_schema_instance_handles_unusual_schemas() -> None:
    rng = random.Random(0)
    assert schema_instance({}, rng) is not None
    assert schema_instance({"type": "null"}, rng) is None
    assert isinstance(schema_instance({"type": "boolean"}, rng), bool)
    assert schema_instance({"type": "object", "required": ["a"]}, rng).keys() == {"a"}
    recursive: Mapping[str, Any] = {
        "$defs": {"node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/node"}}}},
        "$ref": "#/$defs/node",
    }
    for seed in range(20):
        assert not schema_errors(schema_instance(recursive, random.Random(seed)), recursive)


async def test_prefix_lookup_counts_inside_the_time_to_first_token() -> None:
    now = [0.0]

    async def fake_sleep(delay: float) -> None:
        now[0] += delay

    class SlowCache(PrefixCache):
        def match_and_insert(self, prompt_tokens: Sequence[int]) -> int:
            now[0] += 0.01  # the engine's own hashing work, on the API's event loop
            return super().match_and_insert(prompt_tokens)

    deltas = (Delta(text="a", token_ids=(1,)),)
    events = [
        event
        async for event in play(
            [PlannedItem(kind="message", deltas=deltas)],
            request=EngineRequest(prompt_tokens=[], tools=()),
            timing=EngineTiming(tokens_per_second=100, ttft_ms=50),
            prefix_cache=SlowCache(),
            finish_reason="stop",
            clock=lambda: now[0],
            sleep=fake_sleep,
        )
    ]
    # Wall (fake) time equals the modeled time: the 10 ms lookup was absorbed by the TTFT.
    assert now[0] == pytest.approx(0.06)
    assert finish_of(events).engine_seconds == pytest.approx(0.06)


def test_held_bytes_counts_the_prefix_cache_and_is_bounded(encoding: tiktoken.Encoding) -> None:
    engine = sim(encoding, prefix_block_tokens=4, prefix_cache_max_blocks=50)
    assert engine.held_bytes() == 0
    engine.prefix_cache.match_and_insert(list(range(40)))  # 10 blocks
    assert engine.held_bytes() == 10 * PREFIX_BLOCK_BYTES
    engine.prefix_cache.match_and_insert(list(range(1000, 2000)))  # 250 blocks, capped at 50
    assert engine.held_bytes() == 50 * PREFIX_BLOCK_BYTES
    off = sim(encoding, prefix_cache_max_blocks=0)
    off.prefix_cache.match_and_insert(list(range(1000)))
    assert off.held_bytes() == 0


def test_prefix_block_bytes_matches_the_heap() -> None:
    """The per-block estimate is what the heap really grows by (within 25%)."""
    cache = PrefixCache(block_tokens=4, max_blocks=100_000)
    prompts = [[p, *range(1, 400)] for p in range(50)]  # 50 prompts x 100 distinct blocks
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for prompt in prompts:
            cache.match_and_insert(prompt)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(cache) == 5000
    assert 0.75 * PREFIX_BLOCK_BYTES <= grown / len(cache) <= 1.25 * PREFIX_BLOCK_BYTES
