"""Micro-benchmarks of the codec's per-turn work (pytest-benchmark).

``make test`` runs each once as a smoke test (benchmarking disabled); time them with
``pytest tests/codec/test_codec_bench.py --benchmark-enable``. Timings are never asserted.
The tools are the benchmark rollout's 8 definitions, sent again with every create: the client
converts them each turn and so does the server, whose lane then finds its ToolSet again by
fingerprint.
"""

from __future__ import annotations

from bidi_responses.bench.workload import WorkloadSpec, build_workload
from bidi_responses.codec import (
    EventDecoder,
    JSONObject,
    ProtoEncoder,
    params_to_dict,
    params_to_pb,
)
from pytest_benchmark.fixture import BenchmarkFixture

# The headline rollout's instructions and tools; its long outputs are not needed here.
WORKLOAD = build_workload(WorkloadSpec(tool_turns=1, tool_output_tokens=50, user_tokens=50))
CREATE: JSONObject = {
    "model": "sim-model",
    "instructions": WORKLOAD.instructions,
    "tools": WORKLOAD.tools,
    "previous_response_id": "resp_1",
    "input": [{"type": "function_call_output", "call_id": "call_1", "output": "ok " * 4000}],
    "store": False,
}
DELTA: JSONObject = {
    "type": "response.output_text.delta",
    "item_id": "msg_1",
    "output_index": 0,
    "content_index": 0,
    "delta": " token",
    "sequence_number": 7,
}


def test_client_encodes_a_create(benchmark: BenchmarkFixture) -> None:
    params = benchmark(params_to_pb, CREATE)
    assert len(params.tools) == len(WORKLOAD.tools)


def test_server_decodes_a_create(benchmark: BenchmarkFixture) -> None:
    params = params_to_pb(CREATE)
    body = benchmark(params_to_dict, params)
    assert [t["name"] for t in body["tools"]] == [t["name"] for t in WORKLOAD.tools]


def test_server_encodes_a_delta(benchmark: BenchmarkFixture) -> None:
    encoder = ProtoEncoder()
    data = benchmark(encoder.event_bytes, "lane", DELTA)
    assert data == encoder.connect_response("lane", DELTA).SerializeToString()


def test_client_decodes_a_delta(benchmark: BenchmarkFixture) -> None:
    message = ProtoEncoder().connect_response("lane", DELTA)
    assert benchmark(EventDecoder.event, message) == {**DELTA, "stream_id": "lane"}
