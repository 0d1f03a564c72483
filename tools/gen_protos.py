"""Generate Python modules (messages, gRPC stubs) and their typed stubs from protos/.

Usage: python tools/gen_protos.py
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def _plugin(name: str) -> str:
    """The protoc plugin ``name`` from this interpreter's environment (mypy-protobuf's)."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found: install mypy-protobuf (a build and test dependency)")
    return found


def generate(root: Path) -> None:
    """Compile every proto under ``root/protos`` next to its source file."""
    import grpc_tools
    from grpc_tools import protoc

    proto_root = root / "protos"
    protos = sorted(str(p.relative_to(proto_root)) for p in proto_root.rglob("*.proto"))
    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{include}",
        f"--python_out={proto_root}",
        f"--grpc_python_out={proto_root}",
        # Typed stubs for the messages and the service (mypy-protobuf), for mypy and editors.
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--mypy_out={proto_root}",
        f"--mypy_grpc_out={proto_root}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed for {protos}")
    for proto in protos:
        package_dir = proto_root / Path(proto).parent
        init = package_dir / "__init__.py"
        if not init.exists():
            init.write_text('"""Generated from the protos; do not edit."""\n')


if __name__ == "__main__":
    generate(
        Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    )
