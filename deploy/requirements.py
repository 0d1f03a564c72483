"""Print the image's requirements from pyproject.toml, so they install in their own layer.

``python requirements.py run EXTRA...``: the runtime dependencies plus those of the extras
(nested ``bidi-responses[...]`` extras followed). ``python requirements.py build``: what builds
the project's wheel (``build-system.requires``). Standard library only: it runs on the base.
"""

from __future__ import annotations

import re
import sys
import tomllib


def requirements(kind: str, extras: list[str]) -> list[str]:
    """The requirement lines of ``kind`` ("run" or "build")."""
    with open("pyproject.toml", "rb") as handle:
        pyproject = tomllib.load(handle)
    if kind == "build":
        return [*pyproject["build-system"]["requires"], "wheel"]
    optional = pyproject["project"]["optional-dependencies"]
    found = list(pyproject["project"]["dependencies"])
    wanted = [e for e in extras if e]
    seen: set[str] = set()
    while wanted:
        extra = wanted.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in optional[extra]:
            nested = re.fullmatch(r"bidi-responses\[(.+)\]", line)
            if nested:
                wanted += nested[1].split(",")
            else:
                found.append(line)
    return found


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1], " ".join(sys.argv[2:]).replace(",", " ").split())))
