"""The machine, interpreter and library versions a run was measured on."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata

from .records import JSONObject

__all__ = ["machine_info"]


def machine_info() -> JSONObject:
    """Machine, interpreter and library versions, for the results file."""
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions: dict[str, str | None] = {}
    for name in (
        "grpcio",
        "protobuf",
        "websockets",
        "aiohttp",
        "uvicorn",
        "starlette",
        "orjson",
        "tiktoken",
        "psutil",
        "matplotlib",
    ):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    memory = None
    try:
        import psutil

        memory = round(psutil.virtual_memory().total / 2**30, 1)
    except Exception:  # pragma: no cover - psutil is a bench dependency
        pass
    kernel = platform.release()
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "memory_gib": memory,
        "kernel": kernel,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": versions,
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
        "git_commit": _git_commit(),
    }


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
