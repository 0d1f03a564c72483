"""The Envoy configuration of the PostgreSQL overlay, from the generator `make replicas` uses.

``python deploy/k8s/render_envoy.py`` rewrites ``overlays/postgres/envoy.json`` (a test fails
when the committed file differs). The balancing is `bidi_responses.cluster.envoy`'s, unchanged:
least-request over long-lived streams, grpc.health.v1 checks against the service's name (a
draining replica answers NOT_SERVING), outlier detection, no route timeout, retries only where
nothing reached a replica. What Kubernetes changes:

* replicas are found by DNS (``STRICT_DNS`` on the headless Service, which lists ready pods
  only), not listed;
* the listeners bind every interface of the Envoy pod; the admin interface stays on loopback;
* the HTTP cluster is checked with ``GET /readyz``, which turns 503 when a replica drains, so
  new WebSocket and SSE clients avoid it as gRPC clients do (the generator's TCP check cannot
  tell).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bidi_responses.bench.jsontypes import JSONObject
from bidi_responses.cluster.envoy import render_config

# The headless Service of the replicas (overlays/postgres/headless-service.yaml), by its short
# name: pods resolve it in their own namespace.
REPLICAS = "bidi-responses-replicas"
GRPC_PORT = 50051
HTTP_PORT = 8000
ADMIN_PORT = 9901
# How often Envoy re-resolves the replicas: a new pod gets traffic within this.
DNS_REFRESH = "5s"
OUT = Path(__file__).resolve().parent / "overlays" / "postgres" / "envoy.json"


def kubernetes_config() -> JSONObject:
    """The bootstrap configuration for Envoy in the cluster."""
    config = render_config(
        grpc_replicas=[(REPLICAS, GRPC_PORT)],
        http_replicas=[(REPLICAS, HTTP_PORT)],
        grpc_port=GRPC_PORT,
        http_port=HTTP_PORT,
        admin_port=ADMIN_PORT,
        host="0.0.0.0",
    )
    resources = config["static_resources"]
    assert isinstance(resources, dict)
    clusters = resources["clusters"]
    assert isinstance(clusters, list)
    for cluster in clusters:
        assert isinstance(cluster, dict)
        cluster["type"] = "STRICT_DNS"
        cluster["dns_lookup_family"] = "V4_PREFERRED"
        cluster["dns_refresh_rate"] = DNS_REFRESH
        if cluster["name"] == "replicas_http":
            checks = cluster["health_checks"]
            assert isinstance(checks, list) and isinstance(checks[0], dict)
            del checks[0]["tcp_health_check"]
            checks[0]["http_health_check"] = {"path": "/readyz"}
    return config


def render() -> str:
    """The file's text."""
    return json.dumps(kubernetes_config(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}", file=sys.stderr)
