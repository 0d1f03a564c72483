"""The server under test: ``bidi-responses serve`` in a subprocess, from start to stop."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from ..clients import ServerAddress
from ..cpu import process_cpu_clock
from ..ports import free_port
from ..servers import serve_command
from .process import LoggedProcess
from .settings import ServerSettings

__all__ = ["ServerProcess"]


class ServerProcess(LoggedProcess):
    """``bidi-responses serve`` in a subprocess, on free loopback ports."""

    def __init__(
        self, settings: ServerSettings, workdir: Path, name: str, env: dict[str, str] | None = None
    ) -> None:
        self.settings = settings
        self.name = name
        super().__init__(workdir / name, env)
        self.address: ServerAddress | None = None

    def start(self, timeout: float = 60.0) -> ServerAddress:
        """Start and wait until every port accepts connections."""
        config = self.dir / "server.toml"
        config.write_text(self.settings.toml(), encoding="utf-8")
        grpc_port = free_port()
        http_port = free_port() if self.settings.http else None
        command = serve_command(
            config,
            grpc_port=grpc_port,
            http_port=http_port,
            data_dir=self.dir / "data",
            # INFO only adds the start and stop lines; readiness is read from the first.
            extra=["--host", "127.0.0.1", "--log-level", "INFO"],
        )
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child writes it until stop()
        self.proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        log.close()
        # With several workers the server is a process tree: its CPU time is the sum over the
        # tree, and no single pid can be read per turn.
        workers = self.settings.workers
        address = ServerAddress(
            "127.0.0.1", grpc_port, http_port, self.proc.pid if workers == 1 else None
        )
        deadline = time.monotonic() + timeout
        pending = list(address.ports)
        while pending or "listening" not in self.log_tail():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server {self.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"server {self.name} did not listen within {timeout:g} s:\n{self.log_tail()}"
                )
            if not pending:
                time.sleep(0.05)
                continue
            try:
                with socket.create_connection(("127.0.0.1", pending[0]), timeout=1):
                    pending.pop(0)
            except OSError:
                time.sleep(0.05)
        clocks = [process_cpu_clock(self.proc.pid)]
        if workers > 1:
            import psutil

            children = psutil.Process(self.proc.pid).children(recursive=True)
            clocks += [process_cpu_clock(child.pid) for child in children]
        self._cpu = lambda: sum(clock() for clock in clocks)
        self.address = address
        return address
