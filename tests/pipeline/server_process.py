"""``bidi-responses serve`` as a subprocess, for tests that need signals and restarts."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from bidi_responses.bench.ports import free_port

FAST_FLAGS = ("--sim-tps", "1000000", "--sim-ttft-ms", "0", "--sim-tool-rounds", "100")


class ServerLog:
    """The server's output, read continuously (so the pipe never fills), line by line."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.lines: list[str] = []
        self._changed = asyncio.Condition()
        self._ended = False
        self._reader = asyncio.ensure_future(self._read(process))

    async def _read(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            async with self._changed:
                self.lines.append(raw.decode())
                self._changed.notify_all()
        async with self._changed:
            self._ended = True
            self._changed.notify_all()

    async def wait_for(self, needle: str, start: int = 0) -> str:
        """The first line from index ``start`` on that contains ``needle``."""
        async with self._changed:
            while True:
                for line in self.lines[start:]:
                    if needle in line:
                        return line
                assert not self._ended, f"server output ended before {needle!r}: {self}"
                await self._changed.wait()

    async def close(self) -> None:
        """Read to the end of the output."""
        await self._reader

    def __str__(self) -> str:
        return "".join(self.lines)


@asynccontextmanager
async def serve_process(
    data_dir: Path,
    *,
    args: Sequence[str] = FAST_FLAGS,
    http_port: int | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> AsyncIterator[tuple[asyncio.subprocess.Process, int, ServerLog]]:
    """A server subprocess, yielded once it logs that it listens (event-driven readiness).

    gRPC only, unless ``http_port`` is given; ``preexec_fn`` runs in the child before the
    server starts (to set resource limits, say).
    """
    port = free_port()
    http = ["--no-http"] if http_port is None else ["--http-port", str(http_port)]
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bidi_responses.server.cli",
        "serve",
        *http,
        "--grpc-port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--log-level",
        "INFO",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=preexec_fn,
    )
    log = ServerLog(process)
    try:
        await log.wait_for(f"gRPC on 127.0.0.1:{port}")
        yield process, port, log
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await log.close()
