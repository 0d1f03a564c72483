"""`bidi-responses serve` as a user runs it: a subprocess, one log line, a graceful stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from bidi_responses.bench.ports import free_port
from bidi_responses.client import ResponsesClient


def test_serve_logs_where_it_listens_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bidi_responses.server.cli",
            "serve",
            "--no-http",
            "--grpc-port",
            str(port),
            "--data-dir",
            str(tmp_path),
            "--sim-tps",
            "100000",
            "--sim-ttft-ms",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # blocks until the server says where it listens
        assert f"gRPC on 127.0.0.1:{port}" in line, line
        with ResponsesClient(f"127.0.0.1:{port}") as client:
            stream = client.connect()
            response = stream.create(model="sim-model", input="hello")
            stream.close()
            assert response.status == "completed" and response.output_text
            assert client.get(response.id).id == response.id
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_script_engine_needs_a_script() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bidi_responses.server.cli", "serve", "--engine", "script"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--script" in result.stderr
