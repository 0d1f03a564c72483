"""`make serve` installs the core dependencies only: serving must not import an extra's package."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import aiohttp
from bidi_responses.bench.ports import free_port
from bidi_responses.client import AsyncResponsesClient

from tests.pipeline.server_process import FAST_FLAGS, ServerLog

# The top-level modules of every extra's packages (pyproject.toml), and the test tools.
EXTRA_MODULES = (
    "asyncpg", "envoy", "opentelemetry", "matplotlib", "tqdm", "psutil", "xllamacpp", "gguf",
    "grpc_tools", "mypy_protobuf", "pytest", "hypothesis", "httpx", "openai", "mypy", "ruff",
    "cryptography",
)  # fmt: skip

# Runs the server as if none of them were installed (an import of one raises ImportError).
WITHOUT_EXTRAS = f"""
import sys
for name in {EXTRA_MODULES!r}:
    sys.modules[name] = None
from bidi_responses.server.cli import main
sys.exit(main(sys.argv[1:]))
"""


async def test_serve_runs_without_any_extra(tmp_path: Path) -> None:
    grpc_port, http_port = free_port(), free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WITHOUT_EXTRAS, "serve",
        "--grpc-port", str(grpc_port), "--http-port", str(http_port),
        "--data-dir", str(tmp_path), *FAST_FLAGS,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    log = ServerLog(process)
    try:
        async with asyncio.timeout(60):
            await log.wait_for(f"gRPC on 127.0.0.1:{grpc_port}")
            async with (
                AsyncResponsesClient(f"127.0.0.1:{grpc_port}") as client,
                client.connect() as stream,
            ):
                response = await stream.create(model="sim-model", input="hello")
            assert response.status == "completed"
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    f"http://127.0.0.1:{http_port}/v1/responses",
                    json={"model": "sim-model", "input": "hello", "store": False},
                ) as reply,
            ):
                assert reply.status == 200
                assert (await reply.json())["status"] == "completed"
            process.terminate()
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await log.close()
    assert "Traceback" not in str(log), log
