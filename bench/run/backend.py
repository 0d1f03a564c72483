"""The simulated engine's own process (``bench.sim_backend``), from start to stop."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..cpu import process_cpu_clock
from ..lifecycle import ManagedService

__all__ = ["SimBackendProcess"]


class SimBackendProcess(ManagedService):
    """``python -m bidi_responses.bench.sim_backend`` on a free loopback port.

    Its CPU time is read apart from the server's: the engine's pacing is not the API's cost.
    """

    def __init__(self, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.dir = workdir / "sim-backend"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "server.log"
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.base_url: str | None = None
        self._cpu: Callable[[], float] | None = None

    def start(self, timeout: float = 60.0) -> str:
        """Start and wait until it prints the URL it listens on; return that base URL."""
        command = [sys.executable, "-m", "bidi_responses.bench.sim_backend", "--port", "0"]
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child writes it until stop()
        self.proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            for line in self.log_tail().splitlines():
                if line.startswith("listening on "):
                    self.base_url = line.removeprefix("listening on ").strip()
                    self._cpu = process_cpu_clock(self.proc.pid)
                    return self.base_url
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the sim backend exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"the sim backend did not listen within {timeout:g} s")
            time.sleep(0.05)  # polling the log for the readiness line, under a deadline

    def log_tail(self, lines: int = 30) -> str:
        """The end of the backend's log."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def cpu_seconds(self) -> float:
        """The backend's CPU time so far (user + system, all threads)."""
        assert self._cpu is not None
        return self._cpu()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
