"""N replicas on one PostgreSQL behind one Envoy, on this machine (``make replicas``).

Each replica is a ``bidi-responses serve`` process with its own ports and data directory
(for its dead-letter file) and the shared store URL. ``Cluster`` is used by ``make replicas``
(run until Ctrl-C), ``make failover`` and the failover smoke test; it can SIGKILL or SIGTERM a
replica and start it again.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bidi_responses.bench.lifecycle import ManagedService
from bidi_responses.bench.ports import free_port

from .envoy import EnvoyProcess, render_config
from .postgres import TempPostgres


def _accepts(port: int) -> bool:
    """True if something accepts connections on the loopback port."""
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass(slots=True)
class Replica:
    """One server process."""

    index: int
    grpc_port: int
    http_port: int
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def alive(self) -> bool:
        """True while the process runs."""
        return self.process is not None and self.process.poll() is None


class Cluster(ManagedService):
    """PostgreSQL, ``n`` replicas and Envoy; a context manager that tears all down."""

    def __init__(
        self,
        n: int,
        *,
        serve_args: Sequence[str] = (),
        store_url: str | None = None,
        http: bool = True,
        fast_postgres: bool = True,
        grpc_port: int = 0,
        http_port: int = 0,
        admin_port: int = 0,
        replica_ports: int = 0,
        grace_period_s: float = 10.0,
    ) -> None:
        """Ports of 0 are picked free. Envoy listens on ``grpc_port``, ``http_port`` and
        ``admin_port``; replica ``i`` on ``replica_ports + 2i`` (gRPC) and the next (HTTP)."""
        self.root = Path(tempfile.mkdtemp(prefix="bidi-cluster-"))
        self.serve_args = list(serve_args)
        self.http = http
        self.grace_period_s = grace_period_s
        self.postgres: TempPostgres | None = None
        if store_url is None:
            self.postgres = TempPostgres(fast=fast_postgres)
            store_url = self.postgres.url
        self.store_url = store_url
        self.grpc_port = grpc_port or free_port()
        self.http_port = http_port or free_port()
        self.admin_port = admin_port or free_port()
        self.replicas = [
            Replica(
                i,
                replica_ports + 2 * i if replica_ports else free_port(),
                replica_ports + 2 * i + 1 if replica_ports else free_port(),
                self.root / f"replica-{i}",
                self.root / f"replica-{i}.log",
            )
            for i in range(n)
        ]
        self.envoy: EnvoyProcess | None = None

    @property
    def grpc_target(self) -> str:
        """Envoy's gRPC address, for clients."""
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_base_url(self) -> str:
        """Envoy's HTTP base URL (HTTP+SSE; ws:// for WebSocket mode)."""
        return f"http://127.0.0.1:{self.http_port}/v1"

    def start(self, timeout: float = 90.0) -> Cluster:
        """Start PostgreSQL, every replica (in parallel) and Envoy; wait until all are up."""
        if self.postgres is not None:
            self.postgres.start()
        # The schema is migrated by the first replica; the others wait on its advisory lock.
        for replica in self.replicas:
            self.start_replica(replica.index, wait=False)
        for replica in self.replicas:
            self._wait_listening(replica, timeout)
        config = render_config(
            grpc_replicas=[("127.0.0.1", r.grpc_port) for r in self.replicas],
            http_replicas=[("127.0.0.1", r.http_port) for r in self.replicas] if self.http else [],
            grpc_port=self.grpc_port,
            http_port=self.http_port,
            admin_port=self.admin_port,
        )
        self.envoy = EnvoyProcess(config, self.root, self.admin_port)
        self.envoy.start()
        self.envoy.wait_healthy(len(self.replicas), timeout)
        return self

    def start_replica(self, index: int, *, wait: bool = True, timeout: float = 60.0) -> Replica:
        """Start (or restart) replica ``index``."""
        replica = self.replicas[index]
        replica.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            sys.executable, "-m", "bidi_responses.server.cli", "serve",
            "--grpc-port", str(replica.grpc_port),
            "--data-dir", str(replica.data_dir),
            "--store-url", self.store_url,
            "--grace-period-s", str(self.grace_period_s),
            *self.serve_args,
        ]  # fmt: skip
        if self.http:
            args += ["--http-port", str(replica.http_port)]
        else:
            args.append("--no-http")
        with open(replica.log_path, "ab") as log:
            replica.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        if wait:
            self._wait_listening(replica, timeout)
        return replica

    def _wait_listening(self, replica: Replica, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not replica.alive:
                raise RuntimeError(
                    f"replica {replica.index} exited:\n{replica.log_path.read_text()[-3000:]}"
                )
            ports = [replica.grpc_port] + ([replica.http_port] if self.http else [])
            if all(_accepts(port) for port in ports):
                return
            time.sleep(0.05)  # poll interval of a readiness check with a deadline
        raise TimeoutError(f"replica {replica.index} not listening after {timeout} s")

    def kill(self, index: int) -> None:
        """SIGKILL replica ``index`` (a crash: nothing is drained)."""
        process = self.replicas[index].process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=10)

    def terminate(self, index: int) -> None:
        """SIGTERM replica ``index`` (a drain); ``wait`` for it to exit."""
        process = self.replicas[index].process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)

    def wait(self, index: int, timeout: float = 60.0) -> int:
        """Wait for replica ``index`` to exit; its exit code."""
        process = self.replicas[index].process
        assert process is not None
        return process.wait(timeout=timeout)

    def stop(self) -> None:
        """Drain every replica, stop Envoy and PostgreSQL, remove the directory."""
        for replica in self.replicas:
            self.terminate(replica.index)
        for replica in self.replicas:
            process = replica.process
            if process is None:
                continue
            try:
                process.wait(timeout=self.grace_period_s + 20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if self.envoy is not None:
            self.envoy.stop()
        if self.postgres is not None:
            self.postgres.stop()
        if not os.environ.get("BIDI_KEEP_CLUSTER_DIR"):  # keep the logs for a post-mortem
            shutil.rmtree(self.root, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``make replicas``: run a cluster until Ctrl-C."""
    parser = argparse.ArgumentParser(description="N replicas on one PostgreSQL behind Envoy")
    parser.add_argument("-n", "--replicas", type=int, default=3)
    parser.add_argument("--grpc-port", type=int, default=50051, help="Envoy's gRPC port")
    parser.add_argument("--http-port", type=int, default=8000, help="Envoy's HTTP port")
    parser.add_argument(
        "--admin-port", type=int, default=0, help="Envoy's admin port (default: a free one)"
    )
    parser.add_argument(
        "--replica-ports",
        type=int,
        default=0,
        help="replica i serves gRPC on this + 2i and HTTP on the next port (default: free ones)",
    )
    parser.add_argument(
        "--store-url", default=None, help="an existing database (default: a throwaway one)"
    )
    args, serve_args = parser.parse_known_args(argv)
    cluster = Cluster(
        args.replicas,
        serve_args=serve_args,
        store_url=args.store_url,
        fast_postgres=False,
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        admin_port=args.admin_port,
        replica_ports=args.replica_ports,
    )
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    with cluster:
        print(f"Envoy: gRPC {cluster.grpc_target}, HTTP {cluster.http_base_url}", flush=True)
        print(f"admin: http://127.0.0.1:{cluster.admin_port}/clusters", flush=True)
        print(f"store: {cluster.store_url}", flush=True)
        for r in cluster.replicas:
            pid = r.process.pid if r.process else "-"
            print(
                f"replica {r.index}: pid {pid}, gRPC {r.grpc_port}, HTTP {r.http_port}, "
                f"log {r.log_path}",
                flush=True,
            )
        with contextlib.suppress(KeyboardInterrupt):
            while not stop:
                time.sleep(0.5)  # an idle foreground process; signals end it
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
