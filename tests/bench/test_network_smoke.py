"""The network sweep's relay (``bench.netem``) and a tiny rollout through it, over TLS,
straight to the server, through the project's Envoy, and with several agents sharing the link.

The relay is real: a process (or, for the pacing check, an in-process asyncio relay) on
loopback between real clients and a real server. The delay and the pacing are the relay's
function, so they are asserted as lower bounds: a turn through a 20 ms round trip takes at
least 20 ms, a new HTTPS connection at least three round trips (TCP, TLS 1.3, the request),
and 256 KiB through a 10 Mbit/s link at least its transmission time. Nothing else is timed.
"""

from __future__ import annotations

import asyncio
import csv
import json
import time
from typing import Any

import pytest
from bidi_responses.bench.netem import Link, Relay

from tests.conftest import run_cli

RTT_MS = 20.0
MODES = ("http_new", "http_keepalive", "ws_cache", "grpc_connect")


def test_a_link_serializes_pieces_one_after_another() -> None:
    link = Link(0.010, 1_250_000.0)  # 10 Mbit/s, 10 ms one way
    assert link.release_at(0.0, 12_500) == pytest.approx(0.010 + 0.010)
    # Handed over at once, the second piece waits for the first to be sent.
    assert link.release_at(0.0, 12_500) == pytest.approx(0.020 + 0.010)
    # An idle link sends at once.
    assert link.release_at(1.0, 1_250) == pytest.approx(1.001 + 0.010)
    assert Link(0.040, None).release_at(2.0, 1 << 20) == pytest.approx(2.040)


async def test_the_relay_paces_bytes_to_the_rate() -> None:
    received = asyncio.Event()
    size = 256 * 1024
    got = bytearray()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while len(got) < size:
            data = await reader.read(65536)
            if not data:
                break
            got.extend(data)
        received.set()
        writer.close()

    async with asyncio.timeout(30):
        server = await asyncio.start_server(sink, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        relay = Relay(("127.0.0.1", port), rtt_s=0.0, mbit=10.0)
        relay_port = await relay.start()
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", relay_port)
            started = time.perf_counter()
            writer.write(bytes(size))
            await writer.drain()
            await received.wait()
            elapsed = time.perf_counter() - started
            writer.close()
        finally:
            await relay.close()
            server.close()
    assert len(got) == size
    # 256 KiB at 1.25 MB/s: at least 0.21 s on the wire.
    assert elapsed >= size / 1_250_000


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, str]], Any]:
    out = tmp_path_factory.mktemp("network")
    run_cli(
        "compare",
        "--smoke",
        "--sweeps",
        "network",
        "--network-rtts",
        f"{RTT_MS:g}",
        "--network-modes",
        ",".join(MODES),
        "--no-progress",
        "--no-plots",
        "--out",
        str(out),
        "--doc",
        str(out / "doc" / "results-network.md"),
    )
    with open(out / "turns.csv", encoding="utf-8") as handle:
        turns = list(csv.DictReader(handle))
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    results["document"] = (out / "doc" / "results-network.md").read_text(encoding="utf-8")
    return turns, results


def test_the_run_writes_its_own_document(network: tuple[list[dict[str, str]], Any]) -> None:
    document = network[1]["document"]
    assert "{{" not in document and "n/a" not in document.split("## Targets")[0]
    for section in (
        "## End to end through the link",
        "## Through the mesh's proxy",
        "## A real engine: llama.cpp",
    ):
        assert section in document
    assert "| N1 |" in document  # the 20 ms target, judged


def test_every_transport_completes_its_turns_through_the_relay(
    network: tuple[list[dict[str, str]], Any],
) -> None:
    turns, results = network
    cell = next(c for c in results["cells"] if c["name"] == "network")
    assert cell["params"]["tls"] is True
    # Direct to the server, and (gRPC, WebSocket mode and the baseline) through Envoy.
    paths = [("direct", mode) for mode in MODES]
    paths += [("envoy", mode) for mode in ("http_new", "ws_cache", "grpc_connect")]
    for path, mode in paths:
        runs = [r for r in cell["runs"] if r["mode"] == mode and r["path"] == path]
        assert runs and all(r["statuses"] == ["completed"] for r in runs), (path, mode)
        mine = [t for t in turns if t["mode"] == mode and t["path"] == path]
        assert len(mine) == 3, (path, mode)  # two tool turns and the answer
    assert all(r["proxy_cpu_s"] > 0 for r in cell["runs"] if r["path"] == "envoy")
    # Several agents at once across one link: Connect's on one channel, WebSocket's apart.
    agents = cell["params"]["multiplex_agents"]
    for mode in ("ws_cache", "grpc_connect"):
        # An agent per stream or connection, then an agent per lane of one connection.
        for path in ("multiplex", "lanes"):
            runs = [r for r in cell["runs"] if r["mode"] == mode and r["path"] == path]
            assert runs and all(r["statuses"] == ["completed"] for r in runs), (mode, path)
            assert sum(len(r["e2e_s"]) for r in runs) == agents, (mode, path)
        # A tool output larger than HTTP/2's initial flow-control window, across the link.
        large = [r for r in cell["runs"] if r["mode"] == mode and r["path"] == "large"]
        assert large and all(r["statuses"] == ["completed"] for r in large), mode


def test_every_mode_runs_its_turns_on_llama_cpp(
    network: tuple[list[dict[str, str]], Any],
) -> None:
    """llama.cpp (the tiny generated model, its own process) as the engine, through the link:
    HTTP's full-history modes send the model's own call back, and every mode's turns are
    counted against llama.cpp's CPU, not the server's."""
    turns, results = network
    cell = next(c for c in results["cells"] if c["name"] == "network")
    assert cell["params"]["llama"] == [[RTT_MS, 0]]
    for mode in MODES:
        runs = [r for r in cell["runs"] if r["mode"] == mode and r["path"] == "llama"]
        assert runs and all(r["statuses"] == ["completed"] for r in runs), mode
        assert all(r["engine_cpu_s"] > 0 for r in runs), mode
        mine = [t for t in turns if t["mode"] == mode and t["path"] == "llama"]
        assert len(mine) == 2, mode  # one forced tool turn and the answer


def test_the_relay_adds_its_round_trips(network: tuple[list[dict[str, str]], Any]) -> None:
    turns, _ = network
    for turn in turns:
        assert float(turn["rtt_ms"]) == RTT_MS
        # A request and its answer cross the link once each way.
        assert float(turn["turn_ms"]) >= RTT_MS, turn
        if turn["mode"] == "http_new":
            # A new connection per turn: TCP's handshake, TLS 1.3's, then the request.
            assert float(turn["turn_ms"]) >= 3 * RTT_MS, turn
