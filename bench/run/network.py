"""The network sweep: the headline rollout through an emulated link, over TLS.

For each round-trip time and bandwidth the clients reach the server through a relay process
(``bench.netem``) that delays each direction by RTT/2 and paces bytes to the rate; the link
from the server to the engine stays direct (loopback). One server (TLS on every listener when
asked) serves every condition; a relay process per condition sits in front of it. The mesh
conditions put the project's Envoy (``cluster.envoy``) between the relay and a second server:
the link reaches Envoy, which terminates TLS and proxies to the server on loopback.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from ..clients import AgentsCommand, ModeInfo, ServerAddress
from ..jsontypes import JSONObject
from ..lifecycle import ManagedService
from .measure import Progress, rotated
from .server import ServerProcess
from .settings import CellResult, ServerSettings

if TYPE_CHECKING:
    from .cells import Runner

__all__ = ["RelayProcess", "link_label", "network_cell", "relayed_rollouts", "through"]


def link_label(rtt_ms: float, mbit: float | None) -> str:
    """How a link condition is named in tables and cell names."""
    return f"{rtt_ms:g} ms, " + (f"{mbit:g} Mbit/s" if mbit else "unlimited")


class RelayProcess(ManagedService):
    """``python -m bidi_responses.bench.netem`` in front of some loopback ports."""

    def __init__(
        self, targets: list[int], rtt_ms: float, mbit: float | None, workdir: Path, name: str
    ) -> None:
        self.targets = targets
        self.rtt_ms = rtt_ms
        self.mbit = mbit
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        # Target port -> the relay's port in front of it.
        self.ports: dict[int, int] = {}

    def start(self, timeout: float = 30.0) -> dict[int, int]:
        command = [sys.executable, "-m", "bidi_responses.bench.netem"]
        command += ["--rtt-ms", f"{self.rtt_ms:g}", "--mbit", f"{self.mbit or 0:g}"]
        for port in self.targets:
            command += ["--to", f"127.0.0.1:{port}"]
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child writes it until stop()
        self.proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + timeout
        while len(self.ports) < len(self.targets):
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
            for line in text.splitlines():
                # "relay 127.0.0.1:PORT -> 127.0.0.1:TARGET"
                if line.startswith("relay "):
                    left, _, right = line.removeprefix("relay ").partition(" -> ")
                    self.ports[int(right.rpartition(":")[2])] = int(left.rpartition(":")[2])
            if self.proc.poll() is not None:
                raise RuntimeError(f"the relay exited with {self.proc.returncode}:\n{text}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the relay did not listen within {timeout:g} s:\n{text}")
            if len(self.ports) < len(self.targets):
                time.sleep(0.05)  # polling the log for the readiness lines, under a deadline
        return self.ports

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


def network_cell(runner: Runner, modes: list[ModeInfo]) -> CellResult:
    """Single-agent rollouts through each link condition, ``network_repeats`` times each."""
    cfg = runner.config
    spec = cfg.workload_spec(cfg.network_turns, cfg.network_output_tokens)
    workload = runner.workload(spec)
    settings = runner.settings(modes, tokens_per_second=cfg.tps, tool_rounds=spec.tool_turns)
    ca: str | None = None
    if cfg.network_tls:
        from ..certs import make_server_pki

        pki = make_server_pki(runner.workdir / "pki")
        settings.tls_cert, settings.tls_key = str(pki.cert), str(pki.key)
        ca = str(pki.ca)
    conditions = [(rtt, mbit) for rtt in cfg.network_rtts for mbit in cfg.network_mbits]
    cell = CellResult(
        "network",
        "network",
        {
            "tokens_per_second": cfg.tps,
            "workload": workload.to_json(),
            "server": asdict(settings),
            "repeats": cfg.network_repeats,
            "modes": [m.key for m in modes],
            "rtts_ms": list(cfg.network_rtts),
            "mbits": [m or 0 for m in cfg.network_mbits],
            "tls": cfg.network_tls,
            "mesh": [[rtt, mbit or 0] for rtt, mbit in cfg.network_mesh],
            "multiplex": [[rtt, mbit or 0] for rtt, mbit in cfg.network_multiplex],
            "multiplex_agents": cfg.network_agents,
            "lanes": [[rtt, mbit or 0] for rtt, mbit in cfg.network_lanes],
            "large": [[rtt, mbit or 0] for rtt, mbit in cfg.network_large],
            "large_workload": runner.workload(
                cfg.workload_spec(cfg.network_large_turns, cfg.network_large_tokens)
            ).to_json(),
            "multiplex_workload": runner.workload(
                cfg.workload_spec(cfg.concurrency_turns, cfg.concurrency_output_tokens)
            ).to_json(),
            "llama": [[rtt, mbit or 0] for rtt, mbit in cfg.network_llama],
            "llama_workload": runner.workload(
                cfg.workload_spec(cfg.network_llama_turns, cfg.network_llama_tokens)
            ).to_json(),
        },
    )
    mesh_modes = [m for m in modes if m.transport in ("grpc", "ws") or m.key == "http_new"]
    total = (spec.tool_turns + 1) * cfg.network_repeats
    total *= len(modes) * len(conditions) + len(mesh_modes) * len(cfg.network_mesh)
    many_turns = cfg.network_agents * (cfg.concurrency_turns + 1)
    many_turns *= len(cfg.network_multiplex) + len(cfg.network_lanes)
    total += 2 * many_turns * cfg.network_repeats
    total += 2 * (cfg.network_large_turns + 1) * cfg.network_repeats * len(cfg.network_large)
    total += (
        len(modes) * (cfg.network_llama_turns + 1) * cfg.network_repeats * len(cfg.network_llama)
    )
    with runner.timed(cell, total, "network") as bar, runner.server("network", settings) as server:
        assert server.address is not None
        direct = dataclasses.replace(server.address, tls_ca=ca)
        base = runner.rollout_cmd(workload, direct)
        runner.warm_up(modes, base)
        relayed_rollouts(
            runner, cell, modes, server, direct, bar, base, conditions, "direct", "direct"
        )
        many = [m for m in modes if m.key in ("ws_cache", "grpc_connect")]
        if cfg.network_multiplex and many:
            _multiplex_conditions(runner, cell, many, server, direct, bar, lanes=False)
        if cfg.network_lanes and many:
            _multiplex_conditions(runner, cell, many, server, direct, bar, lanes=True)
        if cfg.network_large and many:
            _large_conditions(runner, cell, many, server, direct, bar)
        if cfg.network_mesh and mesh_modes:
            _mesh_conditions(runner, cell, mesh_modes, base, ca, pki_paths(settings), bar)
    if cfg.network_llama:
        from .network_llama import llama_conditions

        llama_conditions(runner, cell, modes, pki_paths(settings), ca, bar)
    return cell


def _multiplex_conditions(
    runner: Runner,
    cell: CellResult,
    modes: list[ModeInfo],
    server: ServerProcess,
    direct: ServerAddress,
    bar: Progress,
    *,
    lanes: bool,
) -> None:
    """Many agents in one client process across one link. Without ``lanes``: Connect's agents
    share one channel (one HTTP/2 connection, its flow control and its TCP stream), each on
    its own stream, and WebSocket mode's have a connection each. With ``lanes``: each mode's
    agents share one connection, a lane each (one Connect stream, one WebSocket). The link's
    rate is shared either way."""
    cfg = runner.config
    spec = cfg.workload_spec(cfg.concurrency_turns, cfg.concurrency_output_tokens)
    base: AgentsCommand = {
        **runner.rollout_cmd(runner.workload(spec), direct),
        "agents": cfg.network_agents,
        "bytes": False,  # the agents' sockets are not told apart per turn
        # The server's model calls tools for the main rollout's turns: stop at this one's.
        "max_tool_turns": spec.tool_turns,
        "lanes": lanes,
    }
    relayed_rollouts(
        runner,
        cell,
        modes,
        server,
        direct,
        bar,
        base,
        cfg.network_lanes if lanes else cfg.network_multiplex,
        "lanes" if lanes else "multiplex",
        f"{cfg.network_agents} {'lanes' if lanes else 'agents'}",
    )


def _large_conditions(
    runner: Runner,
    cell: CellResult,
    modes: list[ModeInfo],
    server: ServerProcess,
    direct: ServerAddress,
    bar: Progress,
) -> None:
    """Large tool outputs (``network_large_tokens`` a turn) across a long link: each turn's
    upload is bigger than HTTP/2's initial flow-control window (64 KiB), so Connect's upload
    waits for window updates a round trip away where a WebSocket frame is held back only by
    TCP (whose window growth this emulation leaves out, see ``bench.netem``)."""
    cfg = runner.config
    spec = cfg.workload_spec(cfg.network_large_turns, cfg.network_large_tokens)
    # The server's model calls tools for the main rollout's turns: stop at this one's.
    base: AgentsCommand = {
        **runner.rollout_cmd(runner.workload(spec), direct),
        "max_tool_turns": spec.tool_turns,
    }
    relayed_rollouts(
        runner,
        cell,
        modes,
        server,
        direct,
        bar,
        base,
        cfg.network_large,
        "large",
        "large outputs",
    )


def relayed_rollouts(
    runner: Runner,
    cell: CellResult,
    modes: list[ModeInfo],
    server: ServerProcess,
    direct: ServerAddress,
    bar: Progress,
    base: AgentsCommand,
    links: Sequence[tuple[float, float | None]],
    path: str,
    what: str,
    engine_cpu: Callable[[], float] | None = None,
    proxy_cpu: Callable[[], float] | None = None,
) -> None:
    """``base`` run through a relay for each of ``links``, every mode in turn per repeat;
    each run is a row of ``cell`` tagged with its link and ``path`` (``what``: its name on
    the progress bar; ``engine_cpu``: the engine's CPU clock, when not the run's own;
    ``proxy_cpu``: a proxy's in the path, read around each run)."""
    cfg = runner.config
    for rtt, mbit in links:
        label = link_label(rtt, mbit)
        name = f"relay-{path}-{rtt:g}ms-{mbit or 0:g}mbit"
        with RelayProcess(direct.ports, rtt, mbit, runner.workdir, name) as relay:
            address = through(direct, relay.ports)
            for repeat in range(cfg.network_repeats):
                for mode in rotated(modes, repeat):
                    bar.describe(f"{what} {label} {mode.key} r{repeat + 1}")
                    cmd: AgentsCommand = {
                        **base,
                        "server": address,
                        "mode": mode.key,
                        "repeat": repeat,
                        "nonce": f"network-{name}-{mode.key}-{repeat}-{cfg.seed}",
                    }
                    proxy_before = proxy_cpu() if proxy_cpu is not None else 0.0
                    run = runner.run_measured(
                        cell,
                        server,
                        [(runner.worker(mode), cmd)],
                        bar.update,
                        {
                            "mode": mode.key,
                            "repeat": repeat,
                            "rtt_ms": rtt,
                            "mbit": mbit or 0,
                            "tls": cfg.network_tls,
                            "path": path,
                        },
                        engine_cpu=engine_cpu,
                    )
                    if proxy_cpu is not None:
                        run["proxy_cpu_s"] = proxy_cpu() - proxy_before


def pki_paths(settings: ServerSettings) -> tuple[str, str] | None:
    """The certificate and key the server under test was given (None: no TLS)."""
    if settings.tls_cert and settings.tls_key:
        return settings.tls_cert, settings.tls_key
    return None


def _mesh_conditions(
    runner: Runner,
    cell: CellResult,
    modes: list[ModeInfo],
    base: AgentsCommand,
    ca: str | None,
    pki: tuple[str, str] | None,
    bar: Progress,
) -> None:
    """The same rollouts with the project's Envoy between the link and the server.

    Envoy terminates the clients' TLS, as a mesh's ingress or sidecar does, and speaks
    plaintext to a server of its own (HTTP/2 for gRPC, HTTP/1.1 with upgrades for WebSocket
    mode and HTTP); its CPU is read per run, apart from the server's.
    """
    from bidi_responses.cluster.envoy import EnvoyProcess, render_config

    from ..cpu import process_cpu_clock
    from ..ports import free_port

    cfg = runner.config
    settings = runner.settings(modes, tokens_per_second=cfg.tps, tool_rounds=cfg.network_turns)
    with runner.server("network-mesh", settings) as server:
        assert server.address is not None and server.address.http_port is not None
        grpc_port, http_port, admin_port = free_port(), free_port(), free_port()
        config = render_config(
            grpc_replicas=[("127.0.0.1", server.address.grpc_port)],
            http_replicas=[("127.0.0.1", server.address.http_port)],
            grpc_port=grpc_port,
            http_port=http_port,
            admin_port=admin_port,
        )
        if pki is not None:
            _terminate_tls(config, *pki)
        workdir = runner.workdir / "envoy"
        workdir.mkdir(parents=True, exist_ok=True)
        envoy = EnvoyProcess(config, workdir, admin_port)
        try:
            envoy.start()
            envoy.wait_healthy(1)
            assert envoy.pid is not None
            front = ServerAddress("127.0.0.1", grpc_port, http_port, server.address.pid, tls_ca=ca)
            runner.warm_up(modes, {**base, "server": front})
            relayed_rollouts(
                runner,
                cell,
                modes,
                server,
                front,
                bar,
                base,
                cfg.network_mesh,
                "envoy",
                "Envoy",
                proxy_cpu=process_cpu_clock(envoy.pid),
            )
        finally:
            envoy.stop()


def _terminate_tls(config: JSONObject, cert: str, key: str) -> None:
    """Envoy's listeners take TLS from the clients (h2 for gRPC, HTTP/1.1 for the rest)."""
    for listener in config["static_resources"]["listeners"]:
        alpn = ["h2"] if listener["name"] == "grpc" else ["http/1.1"]
        context = {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."
            "DownstreamTlsContext",
            "common_tls_context": {
                "tls_certificates": [
                    {"certificate_chain": {"filename": cert}, "private_key": {"filename": key}}
                ],
                "alpn_protocols": alpn,
            },
        }
        for chain in listener["filter_chains"]:
            chain["transport_socket"] = {
                "name": "envoy.transport_sockets.tls",
                "typed_config": context,
            }


def through(address: ServerAddress, relays: dict[int, int]) -> ServerAddress:
    """The server's address as the clients see it: the relay's ports in front of its own."""
    return dataclasses.replace(
        address,
        grpc_port=relays[address.grpc_port],
        http_port=relays[address.http_port] if address.http_port else None,
    )
