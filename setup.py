"""Build hook: generate the Python gRPC code from the proto before packaging.

The proto under `protos/` is the single source of truth; its generated modules are never
committed or edited by hand, so every build (wheel, sdist or editable) produces them.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildWithProtos(build_py):
    """Run grpc_tools.protoc into the source tree, then build as usual."""

    def run(self) -> None:
        import sys

        sys.path.insert(0, str(ROOT / "tools"))
        from gen_protos import generate

        generate(ROOT)
        super().run()


setup(cmdclass={"build_py": BuildWithProtos})
