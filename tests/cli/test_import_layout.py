"""The package's imports show its structure: inside one area (a top-level folder such as
``server/`` or ``codec/``) names are imported relatively, so a line says which folder a name
comes from (``from ..lanes.session import Session``); another area is imported by its full
name (``from bidi_responses.codec import ...``), as is the generated ``bidi_responses.v1``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AREAS = ("server", "codec", "client", "bench", "cluster", "schema")
# ``from bidi_responses.<area>... import`` or ``import bidi_responses.<area>...``, anywhere in
# a file (imports inside functions and TYPE_CHECKING blocks count too).
_ABSOLUTE = re.compile(r"^\s*(?:from|import) bidi_responses\.(\w+)", re.M)


@pytest.mark.parametrize("area", AREAS)
def test_an_area_imports_its_own_modules_relatively(area: str) -> None:
    offenders = []
    for path in sorted((ROOT / area).rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for match in _ABSOLUTE.finditer(text):
            if match.group(1) == area:
                line = text.count("\n", 0, match.start()) + 1
                offenders.append(f"{path.relative_to(ROOT)}:{line}")
    assert not offenders, f"absolute imports of {area}/ inside {area}/: {offenders[:10]}"


def test_relative_imports_do_not_leave_their_area() -> None:
    # Three dots from server/core/lanes/ reach server/; one more would reach the package root
    # and so another area, which must be named in full instead.
    for area in AREAS:
        for path in sorted((ROOT / area).rglob("*.py")):
            depth = len(path.relative_to(ROOT / area).parts)  # 1: directly in the area
            for match in re.finditer(r"^\s*from (\.+)", path.read_text(encoding="utf-8"), re.M):
                assert len(match.group(1)) <= depth, f"{path.relative_to(ROOT)} leaves {area}/"
