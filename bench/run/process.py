"""What every benchmark subprocess wrapper shares: its log, its CPU clock and its stop."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from ..lifecycle import ManagedService

__all__ = ["LoggedProcess"]


class LoggedProcess(ManagedService):
    """A child process writing ``dir/server.log``; ``start`` sets ``proc`` and ``_cpu``."""

    #: How long a SIGTERM'd child gets to exit before it is killed.
    stop_timeout_s = 15.0

    def __init__(self, directory: Path, env: dict[str, str] | None) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "server.log"
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self._cpu: Callable[[], float] | None = None

    def log_tail(self, lines: int = 30) -> str:
        """The end of the child's log."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def cpu_seconds(self) -> float:
        """The child's CPU time so far (user + system, all threads)."""
        assert self._cpu is not None
        return self._cpu()

    def stop(self) -> None:
        """SIGTERM (graceful), then SIGKILL if it does not exit."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
