"""Generate Python modules (messages, type stubs, gRPC stubs) from protos/.

Usage: python tools/gen_protos.py
"""

from __future__ import annotations

import sys
from pathlib import Path


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
        f"--pyi_out={proto_root}",
        f"--grpc_python_out={proto_root}",
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
