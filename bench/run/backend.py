"""An engine in its own process (the simulated engine or llama.cpp), from start to stop."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from ..cpu import process_cpu_clock
from .process import LoggedProcess

__all__ = ["EngineProcess", "SimBackendProcess", "llama_backend_process"]


class EngineProcess(LoggedProcess):
    """``python -m <module> --port 0``: a completions backend on a free loopback port that
    prints ``listening on <base URL>`` once ready.

    Its CPU time is read apart from the server's: the engine's work is not the API's cost.
    """

    stop_timeout_s = 10.0

    def __init__(
        self, workdir: Path, module: str, env: dict[str, str] | None = None, name: str = ""
    ) -> None:
        self.module = module
        self.name = name or module.rpartition(".")[2]
        super().__init__(workdir / self.name.replace("_", "-"), env)
        self.base_url: str | None = None

    def start(self, timeout: float = 60.0) -> str:
        """Start and wait until it prints the URL it listens on; return that base URL."""
        command = [sys.executable, "-m", self.module, "--port", "0"]
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
                    f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not listen within {timeout:g} s")
            time.sleep(0.05)  # polling the log for the readiness line, under a deadline


class SimBackendProcess(EngineProcess):
    """The simulated engine (``bench.sim_backend``): the protocol's timing model."""

    def __init__(self, workdir: Path, env: dict[str, str] | None = None) -> None:
        super().__init__(workdir, "bidi_responses.bench.sim_backend", env, "sim_backend")


def llama_backend_process(workdir: Path, env: dict[str, str] | None = None) -> EngineProcess:
    """llama.cpp serving the tiny generated model (``bench.llama_backend``)."""
    return EngineProcess(workdir, "bidi_responses.bench.llama_backend", env, "llama_cpp")
