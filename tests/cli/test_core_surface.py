"""The transports use the core through its face only: what the core's package and each of its
subpackages offer in their ``__init__`` (``from ...core.api import ApiError``, never
``from ...core.api.errors import ApiError``), and the ports the application hands them; and
few modules name the core's facade (``ResponsesCore``): the core itself and the application
that builds it and hands each transport its ports."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "server"
CORE = SERVER / "core"
# The most modules of the package that may name the facade.
MAX_FACADE_NAMERS = 8


def _package_of(path: Path) -> list[str]:
    """The package a module's relative imports start from: ``server/transports/http/app.py``
    -> ``["server", "transports", "http"]``."""
    return list(path.relative_to(ROOT).parent.parts)


def _imported(text: str, package: list[str]) -> list[tuple[int, list[str]]]:
    """Each module of the package that ``text`` imports from (line, dotted parts below
    ``bidi_responses``), its relative imports resolved from ``package``."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                found.append((node.lineno, base + (node.module.split(".") if node.module else [])))
            elif node.module and node.module.startswith("bidi_responses."):
                found.append((node.lineno, node.module.split(".")[1:]))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("bidi_responses."):
                    found.append((node.lineno, alias.name.split(".")[1:]))
    return found


def _deep_core_imports(text: str, package: list[str]) -> list[tuple[int, str]]:
    """Imports in ``text`` that reach into the core past its package or a subpackage's
    ``__init__`` (a module such as ``core.service``, or ``core.api.errors``)."""
    offenders = []
    for line, parts in _imported(text, package):
        if parts[:2] != ["server", "core"] or len(parts) == 2:
            continue
        inside = parts[2:]
        if len(inside) == 1 and (CORE / inside[0] / "__init__.py").exists():
            continue
        offenders.append((line, ".".join(parts)))
    return offenders


def test_transports_import_only_the_core_s_public_surfaces() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line} {module}"
        for path in sorted((SERVER / "transports").rglob("*.py"))
        for line, module in _deep_core_imports(path.read_text(encoding="utf-8"), _package_of(path))
    ]
    assert not offenders, f"transports reaching past the core's face: {offenders}"


def test_the_surface_check_tells_a_deep_import_from_a_surface() -> None:
    # From server/transports/grpc/: the rules the check above applies, on known lines.
    package = ["server", "transports", "grpc"]
    text = (
        "from ...core import TransportPort\n"
        "from ...core.api import ApiError\n"
        "from ...core.api.errors import shown\n"
        "from ...core.service import ResponsesCore\n"
        "from bidi_responses.server.core.runs.record import OutEvent\n"
        "from ..streams import StreamDriver\n"
    )
    assert _deep_core_imports(text, package) == [
        (3, "server.core.api.errors"),
        (4, "server.core.service"),
        (5, "server.core.runs.record"),
    ]


def test_every_core_subpackage_declares_its_public_surface() -> None:
    missing = [
        str(init.relative_to(ROOT))
        for init in sorted(CORE.glob("*/__init__.py"))
        if "__all__" not in init.read_text(encoding="utf-8")
    ]
    assert not missing, f"core subpackages without __all__: {missing}"


def test_few_modules_name_the_core_s_facade() -> None:
    naming = sorted(
        str(path.relative_to(ROOT))
        for area in ("server", "bench", "cluster", "client")
        for path in (ROOT / area).rglob("*.py")
        if re.search(r"\bResponsesCore\b", path.read_text(encoding="utf-8"))
    )
    assert len(naming) <= MAX_FACADE_NAMERS, f"{len(naming)} modules name ResponsesCore: {naming}"
