"""The simulated engine's own process (``bench.sim_backend``), from start to stop."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from ..cpu import process_cpu_clock
from .process import LoggedProcess

__all__ = ["SimBackendProcess"]


class SimBackendProcess(LoggedProcess):
    """``python -m bidi_responses.bench.sim_backend`` on a free loopback port.

    Its CPU time is read apart from the server's: the engine's pacing is not the API's cost.
    """

    stop_timeout_s = 10.0

    def __init__(self, workdir: Path, env: dict[str, str] | None = None) -> None:
        super().__init__(workdir / "sim-backend", env)
        self.base_url: str | None = None

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
