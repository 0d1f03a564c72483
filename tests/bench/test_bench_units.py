"""The harness's pure parts: modes, workload generation, statistics, byte counters, config."""

from __future__ import annotations

import socket
import tomllib
from pathlib import Path

import pytest
from bidi_responses.bench.clients import MODES, resolve_modes
from bidi_responses.bench.report import percentile
from bidi_responses.bench.run import ServerSettings, window_label
from bidi_responses.bench.wire import WireCounter
from bidi_responses.bench.workload import (
    WorkloadSpec,
    build_history_workload,
    build_workload,
    load_trace_turns,
    write_trace,
)
from bidi_responses.server.config import StreamingConfig, load_config


def _words(text: str) -> int:
    # A cheap stand-in tokenizer: the generator only needs a monotone count.
    return len(text.split())


def test_resolve_modes() -> None:
    assert [m.key for m in resolve_modes("all")] == list(MODES)
    assert [m.number for m in resolve_modes("7,ws_cache,1,7")] == [7, 4, 1]
    with pytest.raises(ValueError, match="unknown mode"):
        resolve_modes("13")


def test_workload_is_deterministic_and_sized() -> None:
    spec = WorkloadSpec(
        seed=3, tool_turns=4, tool_output_tokens=500, user_tokens=200, instructions_tokens=100
    )
    a = build_workload(spec, _words)
    b = build_workload(spec, _words)
    assert a.tool_outputs == b.tool_outputs and a.user_text == b.user_text
    assert len(a.tool_outputs) == 4
    assert len(set(a.tool_outputs)) == 4
    for text in a.tool_outputs:
        assert 400 <= _words(text) <= 500
        assert text.endswith("\n")
    other = build_workload(WorkloadSpec(seed=4, tool_turns=4, tool_output_tokens=500), _words)
    assert other.tool_outputs != a.tool_outputs
    assert a.user_message("n1") != a.user_message("n2")


def test_history_workload_reaches_its_target() -> None:
    hw = build_history_workload(
        0, max_tokens=20_000, chunk_tokens=1000, small_turns=2, counter=_words
    )
    small = hw.history(1000)
    assert len(small) == 1  # only the user message
    big = hw.history(20_000)
    outputs = [i for i in big if i["type"] == "function_call_output"]
    calls = [i for i in big if i["type"] == "function_call"]
    assert len(outputs) == len(calls) >= 15
    assert [o["call_id"] for o in outputs] == [c["call_id"] for c in calls]


def test_trace_round_trip(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "trace.jsonl", 5)
    assert load_trace_turns(path) == 5


def test_percentile() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0], 100) == 2.0
    assert percentile([0.0, 10.0], 99) == pytest.approx(9.9)
    assert percentile([5.0], 99) == 5.0


def test_server_settings_toml_is_what_the_server_reads(tmp_path: Path) -> None:
    settings = ServerSettings(
        tokens_per_second=4000,
        tool_rounds=7,
        answer_tokens=123,
        coalesce_deltas=False,
        delta_window_ms=2.5,
        engine="script",
        script_path=str(tmp_path / 'a "b".jsonl'),
    )
    path = tmp_path / "server.toml"
    path.write_text(settings.toml(), encoding="utf-8")
    tomllib.loads(settings.toml())
    config = load_config(path)
    route = config.models["sim-model"]
    assert route.engine == "script" and route.script_path == str(tmp_path / 'a "b".jsonl')
    assert route.sim.tokens_per_second == 4000 and route.sim.tool_rounds == 7
    assert route.sim.answer_tokens == 123
    assert config.streaming.coalesce_deltas is False
    assert config.streaming.delta_window_ms == 2.5


def test_cells_run_at_the_servers_default_window(tmp_path: Path) -> None:
    default = StreamingConfig().delta_window_ms
    path = tmp_path / "server.toml"
    path.write_text(ServerSettings().toml(), encoding="utf-8")
    assert load_config(path).streaming.delta_window_ms == default
    assert window_label(default) == f"window {default:g} ms (default)"
    assert window_label(default + 1) == f"window {default + 1:g} ms"
    assert window_label(None) == "off"


def test_wire_counter_reads_tcp_payload_bytes() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        counter = WireCounter("127.0.0.1", [port])
        if not counter.available:
            pytest.skip("TCP_INFO byte counters need Linux")
        with socket.create_connection(("127.0.0.1", port)) as client:
            peer, _ = server.accept()
            with peer:
                before = counter.snapshot()
                client.sendall(b"x" * 1000)
                assert len(peer.recv(4096)) > 0
                peer.sendall(b"y" * 300)
                got = b""
                while len(got) < 300:
                    got += client.recv(4096)
                after = counter.snapshot()
        sent, received = WireCounter.delta(before, after)
        assert sent == 1000
        assert received == 300


def test_the_engine_process_route_carries_the_sim_settings(tmp_path: Path) -> None:
    settings = ServerSettings(sim_backend_url="http://127.0.0.1:9/v1", tool_rounds=7)
    settings.answer_tokens = 123
    path = tmp_path / "server.toml"
    path.write_text(settings.toml(), encoding="utf-8")
    route = load_config(path).models["sim-model"]
    assert route.engine == "completions" and route.completions.format == "generic"
    sim = route.completions.extra_body["sim"]
    assert isinstance(sim, dict)
    assert sim["tool_rounds"] == 7 and sim["answer_tokens"] == 123
    # The history sweep's 200k-token prompts fit the route's context window.
    assert route.completions.context_window > 200_000


def test_the_crossover_is_interpolated_between_measured_rtts() -> None:
    from bidi_responses.bench.report.summaries import _first_reaching

    assert _first_reaching([(0, 1.1), (20, 1.3), (80, 1.9)], 1.40) == pytest.approx(30.0)
    assert _first_reaching([(0, 1.5), (20, 1.6)], 1.40) == 0
    assert _first_reaching([(0, 1.1), (80, 1.2)], 1.40) is None
