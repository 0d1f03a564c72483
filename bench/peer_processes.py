"""The processes ``make peers`` starts beside this project's server: the fake model and SMG.

Each runs in its own process group on loopback and is stopped with it; SMG's CPU clock covers
the launcher and whatever it started, so the peers' server CPU is counted alike.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from .cpu import process_cpu_clock
from .ports import free_port

__all__ = ["HelperProcess", "SmgGateway"]


class HelperProcess:
    """A helper process on loopback that prints ``listening on URL`` when ready."""

    def __init__(self, command: list[str], log: Path) -> None:
        self.log_path = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_url(self, timeout: float = 60.0) -> str:
        """The URL it announced once ready; raises if it exits or misses the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.log_path.read_text(errors="replace").splitlines():
                if line.startswith("listening on "):
                    return line.removeprefix("listening on ").strip()
            self._check(deadline, timeout)
            time.sleep(0.05)  # polling the log for the readiness line, under a deadline

    def _check(self, deadline: float, timeout: float) -> None:
        if self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.proc.args!r} exited with {self.proc.returncode}:\n{tail}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{self.proc.args!r} was not ready within {timeout:g} s")

    def stop(self) -> None:
        """Terminate its process group, killing it if it does not exit within 10 s."""
        if self.proc.poll() is None:
            # The process group this object started (SMG's launcher runs the gateway in it).
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)


class SmgGateway(HelperProcess):
    """``smg launch --backend openai --history-backend memory`` on loopback."""

    def __init__(self, smg: str, model_url: str, log: Path) -> None:
        self.port = free_port()
        super().__init__(
            [
                smg,
                "launch",
                "--backend",
                "openai",
                "--history-backend",
                "memory",
                "--worker-urls",
                model_url.removesuffix("/v1"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                # A log line per request is not the gateway's forwarding cost.
                "--log-level",
                "warn",
            ],
            log,
        )
        self._clocks: list[Callable[[], float]] = []

    async def wait_ready(self, session: aiohttp.ClientSession, limit_s: float = 60.0) -> None:
        """Until a response goes through (the gateway registers its worker in the background)."""
        deadline = time.monotonic() + limit_s
        body = {"model": "sim-model", "input": "ready?", "store": False}
        while True:
            self._check(deadline, limit_s)
            try:
                async with session.post(self.url + "/v1/responses", json=body) as reply:
                    if reply.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)  # polling readiness under a deadline
        import psutil

        # The launcher and whatever it started (the gateway may run as its child).
        root = psutil.Process(self.proc.pid)
        pids = [root.pid, *(child.pid for child in root.children(recursive=True))]
        self._clocks = [process_cpu_clock(pid) for pid in pids]

    @property
    def url(self) -> str:
        """The gateway's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        """CPU time of the launcher and its children, the server CPU of SMG's turns."""
        return sum(clock() for clock in self._clocks)
