"""A throwaway PostgreSQL server: Debian's binaries, a temp directory, a loopback port.

Used by the store conformance tests, ``make replicas`` and ``make failover``. PostgreSQL
refuses to run as root, so as root the cluster is created and run as the ``postgres`` system
user that Debian's package adds (``runuser``). ``make postgres`` installs the package.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from bidi_responses.bench.lifecycle import ManagedService
from bidi_responses.bench.ports import free_port


class PostgresUnavailable(RuntimeError):
    """PostgreSQL's server binaries are not installed (``make postgres`` installs them)."""


def find_bin_dir() -> Path:
    """The directory of ``initdb`` and ``postgres`` (the newest Debian version wins)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb is not None:
        return Path(os.path.realpath(initdb)).parent
    raise PostgresUnavailable(
        "PostgreSQL is not installed (no initdb under /usr/lib/postgresql/*/bin): "
        "run `make postgres` (apt-get install postgresql)"
    )


class TempPostgres(ManagedService):
    """Start with ``with TempPostgres() as pg:``; ``pg.url`` is the database to use.

    ``fast=True`` turns off fsync (tests: the data dies with the directory anyway); the
    failover run keeps PostgreSQL's defaults.
    """

    def __init__(self, *, fast: bool = True, port: int | None = None) -> None:
        self.bin_dir = find_bin_dir()
        self.fast = fast
        self.port = port or free_port()
        self.user = "bidi"
        self.root = Path(tempfile.mkdtemp(prefix="bidi-pg-"))
        self.data = self.root / "data"
        self.log_path = self.root / "postgres.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._as: list[str] = []
        if os.geteuid() == 0:
            # PostgreSQL will not run as root: run it as Debian's postgres user.
            self._as = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.root, "postgres", "postgres")
        self.root.chmod(0o700)

    @property
    def url(self) -> str:
        """The connection URL (trust authentication on loopback)."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"

    @property
    def pid(self) -> int | None:
        """The server's process id (``runuser`` as root, whose child is the postmaster)."""
        return self._process.pid if self._process is not None else None

    def _run(self, *args: str) -> None:
        subprocess.run(
            [*self._as, *args], check=True, capture_output=True, cwd=self.root, timeout=120
        )

    def start(self, timeout: float = 60.0) -> TempPostgres:
        """initdb, start the server, wait until it accepts connections."""
        try:
            self._run(
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                self.user,
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            )
        except subprocess.CalledProcessError as error:
            raise RuntimeError(f"initdb failed: {error.stderr.decode(errors='replace')}") from None
        settings = [
            "-c", f"port={self.port}",
            "-c", "listen_addresses=127.0.0.1",
            "-c", f"unix_socket_directories={self.root}",
            "-c", "max_connections=200",
        ]  # fmt: skip
        if self.fast:
            settings += ["-c", "fsync=off", "-c", "synchronous_commit=off"]
            settings += ["-c", "full_page_writes=off"]
        log = open(self.log_path, "ab")  # noqa: SIM115 - the server process keeps writing it
        try:
            self._process = subprocess.Popen(
                [*self._as, str(self.bin_dir / "postgres"), "-D", str(self.data), *settings],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                start_new_session=True,
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"postgres exited at start:\n{self.log_tail()}")
            ready = subprocess.run(
                [str(self.bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                capture_output=True,
                timeout=10,
            )
            if ready.returncode == 0:
                return self
            time.sleep(0.1)  # poll interval of a readiness check with a deadline
        self.stop()
        raise TimeoutError(f"postgres did not accept connections in {timeout} s")

    def log_tail(self, lines: int = 20) -> str:
        """The end of the server log."""
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        """Fast shutdown, then remove the directory."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            # SIGINT: PostgreSQL's "fast" shutdown. The process group reaches runuser's child.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)
