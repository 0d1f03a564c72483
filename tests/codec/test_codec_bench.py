"""Micro-benchmarks of the codec's per-turn work against orjson on the same content.

``make test`` runs each once as a smoke test (benchmarking disabled); time them with
``pytest tests/codec/test_codec_bench.py --benchmark-enable``, which prints each pair's
medians and their ratio at the end, and for a turn's encoding also the ratio timed in
alternation (``paired_ratios``): the figure to trust on a shared machine, where separate
benchmarks' medians move with the load. Timings are never asserted.

The content is a headline turn (``headline_turn``): the server writes its 24 events (three
snapshots echoing the rollout's instructions and 8 tools) and reads the next create (the same
tools, a tool output); the client does the opposite. The JSON side is what WebSocket mode
costs for the same content: ``orjson.dumps`` of each event, ``orjson.loads`` of the create.
Each protobuf round is the next turn of one long stream: new ids, usage and stats every
turn (what a snapshot's encoding can reuse from the last turn is only what a real stream's
can), one encoder.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from typing import cast

import orjson
import pytest
from bidi_responses.codec import (
    EventDecoder,
    JSONObject,
    ProtoDecoder,
    ProtoEncoder,
    decode_message,
    params_to_pb,
    unbatch,
)
from bidi_responses.codec.tools import forget_tools
from bidi_responses.v1 import responses_pb2 as pb
from pytest_benchmark.fixture import BenchmarkFixture

from tests.codec.headline_turn import WORKLOAD, create_body, headline_turn

# Medians (seconds) of the runs of this module, per benchmark group and side.
MEDIANS: dict[str, dict[str, float]] = {}
SIDES = ["protobuf", "orjson"]
# Per group timed in alternation: the rounds' ratios' median and quartiles.
PAIRED: dict[str, tuple[float, float, float]] = {}


def ratio_lines() -> list[str]:
    """One line per group measured in this run: each side's median and its ratio to
    orjson's (printed at the end of the run by this directory's ``conftest``)."""
    lines = []
    for group, sides in MEDIANS.items():
        reference = sides.get("orjson")
        if reference is None or len(sides) < 2:
            continue
        measured = ", ".join(
            f"{side} {median * 1e6:.1f} us ({median / reference:.2f}x)"
            for side, median in sides.items()
            if side != "orjson"
        )
        lines.append(f"{group}: orjson {reference * 1e6:.1f} us, {measured}")
    for group, (median, low, high) in PAIRED.items():
        lines.append(f"{group}, in alternation: {median:.2f}x (quartiles {low:.2f}-{high:.2f}x)")
    return lines


def paired_ratios(
    measured: Callable[[], object], reference: Callable[[], object], rounds: int, runs: int = 4
) -> list[float]:
    """Per round, ``runs`` calls of ``measured`` timed against as many of ``reference`` right
    before or after (the order alternating): a load that comes and goes slows both sides of
    a round alike, where separate benchmarks would each see it or not."""
    ratios = []
    clock = time.perf_counter_ns
    for n in range(rounds):
        spans = [0, 0]
        for side in (0, 1) if n % 2 else (1, 0):
            fn = measured if side == 0 else reference
            start = clock()
            for _ in range(runs):
                fn()
            spans[side] = clock() - start
        ratios.append(spans[0] / max(spans[1], 1))
    return ratios


def run(benchmark: BenchmarkFixture, group: str, side: str, fn: Callable[[], object]) -> object:
    """Benchmark ``fn`` in ``group`` and keep its median for the ratio line."""
    benchmark.group = group
    result = benchmark(fn)
    if not benchmark.disabled and benchmark.stats is not None:
        MEDIANS.setdefault(group, {})[side] = benchmark.stats.stats.median
    return result


def _turns(count: int) -> list[list[JSONObject]]:
    """``count`` headline turns of one stream, each with its own response and item ids, and
    its own usage and timings, as a stream's turns differ (the history grows, and no two
    turns take the same time): nothing of one turn's counters is reused by the next."""
    turns = []
    for n in range(count):
        events = orjson.loads(orjson.dumps(headline_turn()).replace(b"5d06a54d", b"%08x" % n))
        for e in events:  # the core hands the encoder its checked tool list, not JSON
            if "response" in e:
                r = e["response"]
                r["tools"] = headline_turn()[0]["response"]["tools"]
                _grown(r, n)
        turns.append(events)
    return turns


def _grown(r: JSONObject, n: int) -> None:
    """``r``'s counters as in the ``n``th turn of its stream."""
    stats, usage = r["stats"], r["usage"]
    assert isinstance(stats, dict)
    history = 97 * n  # each turn adds its input and output to the history
    for name in ("tokens_rendered", "tokens_reused"):
        stats[name] += history
    for name in ("engine_ms", "api_pre_ms", "api_post_ms"):
        if stats[name]:
            stats[name] = round(stats[name] * (1 + n / 37), 3)
    stats["stage_ms"] = {k: round(v * (1 + n / 29), 3) for k, v in stats["stage_ms"].items()}
    if isinstance(usage, dict):
        usage["input_tokens"] += history
        usage["input_tokens_details"]["cached_tokens"] += history
        usage["total_tokens"] += history


TURNS = _turns(16)


@pytest.mark.parametrize("side", SIDES)
def test_server_encodes_a_turn(benchmark: BenchmarkFixture, side: str) -> None:
    encoder = ProtoEncoder()
    turns = itertools.cycle(TURNS)
    encode: Callable[[JSONObject], bytes] = (
        (lambda e: encoder.event_bytes("lane", e)) if side == "protobuf" else orjson.dumps
    )

    def turn() -> list[bytes]:
        return [encode(e) for e in next(turns)]

    written = run(benchmark, "server encodes a turn", side, turn)
    assert isinstance(written, list) and len(written) == len(TURNS[0])
    if side == "protobuf":  # each event reads back as the event it was written from
        events = next(turns)
        for e, data in zip(events, turn(), strict=True):
            read = EventDecoder.event(pb.ConnectResponse.FromString(data))
            assert read["type"] == e["type"] and read["sequence_number"] == e["sequence_number"]


def test_server_encodes_a_turn_in_alternation(benchmark: BenchmarkFixture) -> None:
    """``test_server_encodes_a_turn``'s comparison with both sides timed round by round
    (``paired_ratios``): its ratio holds still on a machine whose load moves."""
    encoder = ProtoEncoder()
    proto_turns, json_turns = itertools.cycle(TURNS), itertools.cycle(TURNS)

    def proto_turn() -> list[bytes]:
        return [encoder.event_bytes("lane", e) for e in next(proto_turns)]

    def json_turn() -> list[bytes]:
        return [orjson.dumps(e) for e in next(json_turns)]

    rounds = 3 if benchmark.disabled else 1000
    # (One call: the rounds are timed inside; pytest-benchmark's own figure is their total.)
    pedantic = cast(Callable[..., list[float]], benchmark.pedantic)
    ratios = pedantic(paired_ratios, args=(proto_turn, json_turn, rounds), rounds=1, iterations=1)
    assert len(ratios) == rounds and min(ratios) > 0
    if not benchmark.disabled:
        low, median, high = statistics.quantiles(ratios, n=4)
        PAIRED["server encodes a turn"] = (median, low, high)


CREATE = create_body()
CREATE_EVENT: JSONObject = {"type": "response.create", **CREATE}
CREATE_JSON = orjson.dumps(CREATE_EVENT)
CREATE_PROTO = pb.ConnectRequest(response_create=params_to_pb(CREATE)).SerializeToString()


@pytest.mark.parametrize("side", SIDES)
def test_server_decodes_a_create(benchmark: BenchmarkFixture, side: str) -> None:
    decoder = ProtoDecoder()

    def decode() -> JSONObject:
        if side == "protobuf":
            # As the gRPC transport reads a Connect message.
            request = decode_message(pb.ConnectRequest, CREATE_PROTO)
            return decoder.client_event(request, decoder.tool_keys(CREATE_PROTO))
        body: JSONObject = orjson.loads(CREATE_JSON)
        return body

    event = run(benchmark, "server decodes a create", side, decode)
    assert isinstance(event, dict)
    assert [t["name"] for t in event["tools"]] == [t["name"] for t in WORKLOAD.tools]
    assert event["input"] == CREATE["input"]


@pytest.mark.parametrize("side", SIDES)
def test_client_encodes_a_create(benchmark: BenchmarkFixture, side: str) -> None:
    def encode() -> bytes:
        if side == "protobuf":  # as the client's ConnectStream builds it
            request = pb.ConnectRequest(stream_id="lane")
            params_to_pb(CREATE, into=request.response_create)
            return request.SerializeToString()
        return orjson.dumps(CREATE_EVENT)

    data = run(benchmark, "client encodes a create", side, encode)
    assert isinstance(data, bytes)
    if side == "protobuf":
        assert ProtoDecoder.client_event(pb.ConnectRequest.FromString(data))["tools"] == [
            {k: v for k, v in t.items() if v is not None} for t in WORKLOAD.tools
        ]


ENCODED_TURN = [ProtoEncoder().event_bytes("lane", e) for e in TURNS[0]]
JSON_TURN = [orjson.dumps(e) for e in TURNS[0]]


@pytest.mark.parametrize("side", SIDES)
def test_client_decodes_a_turn(benchmark: BenchmarkFixture, side: str) -> None:
    def decode() -> list[JSONObject]:
        if side == "protobuf":
            return [
                EventDecoder.event(event)
                for data in ENCODED_TURN
                for event in unbatch(pb.ConnectResponse.FromString(data))
            ]
        return [orjson.loads(data) for data in JSON_TURN]

    events = run(benchmark, "client decodes a turn", side, decode)
    assert isinstance(events, list)
    assert [e["type"] for e in events] == [e["type"] for e in TURNS[0]]


CREATE_PROTO_JSON = pb.ConnectRequest(
    response_create=params_to_pb(CREATE, json_parameters=True)
).SerializeToString()


@pytest.mark.parametrize("side", ["protobuf", "protobuf-json-schemas", "orjson"])
def test_server_decodes_a_create_with_new_tools(benchmark: BenchmarkFixture, side: str) -> None:
    """The first create of a tool list (or one after it changed): nothing cached, the tools
    converted from Structs, or parsed from JSON text (``parameters_json``)."""
    raw = CREATE_PROTO_JSON if side == "protobuf-json-schemas" else CREATE_PROTO

    def decode() -> JSONObject:
        if side == "orjson":
            body: JSONObject = orjson.loads(CREATE_JSON)
            return body
        forget_tools()
        return ProtoDecoder.client_event(
            decode_message(pb.ConnectRequest, raw), ProtoDecoder.tool_keys(raw)
        )

    event = run(benchmark, "server decodes a create, new tools", side, decode)
    assert isinstance(event, dict)
    assert [t["name"] for t in event["tools"]] == [t["name"] for t in WORKLOAD.tools]
