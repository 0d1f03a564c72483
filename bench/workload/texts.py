"""Text that looks like a coding agent's: source files, test runs, logs, diffs, cut to size.

Every generator is a pure function of the ``random.Random`` it is given, so a seed replays
byte-identical texts.
"""

from __future__ import annotations

import random
from collections.abc import Callable

__all__ = [
    "MODULES",
    "NOUNS",
    "TokenCounter",
    "file_path",
    "fit",
    "instructions_blocks",
    "sentence",
    "tool_output_blocks",
    "unified_diff",
    "user_blocks",
]

TokenCounter = Callable[[str], int]


def fit(blocks: Callable[[], str], target: int, counter: TokenCounter) -> str:
    """Concatenate generated blocks until ``target`` tokens, then cut at a line end.

    Blocks are counted one at a time (a block's count is close to its share of the whole);
    the final text is counted once and trimmed line by line, so the result is within a line
    of the target and always ends at a line boundary, as tool output does.
    """
    if target <= 0:
        return ""
    parts: list[str] = []
    total = 0
    while total < target:
        block = blocks()
        parts.append(block)
        total += counter(block)
    text = "".join(parts)
    lines = text.splitlines(keepends=True)
    count = counter(text)
    # Drop whole lines from the end while clearly over; one encode per step is affordable
    # because the overshoot is at most one block.
    while count > target and len(lines) > 1:
        lines.pop()
        count = counter("".join(lines))
    return "".join(lines)


MODULES = (
    "server",
    "client",
    "core",
    "render",
    "session",
    "store",
    "router",
    "engine",
    "pipeline",
    "cache",
    "stream",
    "transport",
    "codec",
    "tokenizer",
    "worker",
    "scheduler",
    "config",
    "metrics",
    "auth",
    "billing",
)
NOUNS = (
    "request",
    "response",
    "token",
    "item",
    "stream",
    "event",
    "buffer",
    "record",
    "state",
    "history",
    "frame",
    "message",
    "batch",
    "handler",
    "result",
    "config",
    "route",
    "lane",
    "session",
    "payload",
    "chunk",
    "cursor",
    "window",
    "budget",
)
_VERBS = (
    "parse",
    "render",
    "encode",
    "decode",
    "flush",
    "append",
    "resolve",
    "validate",
    "load",
    "store",
    "emit",
    "merge",
    "split",
    "fetch",
    "update",
    "check",
    "build",
    "apply",
    "drain",
    "reset",
    "collect",
    "schedule",
    "retry",
    "close",
)
_TYPES = (
    "int",
    "str",
    "bytes",
    "float",
    "bool",
    "list[int]",
    "dict[str, Any]",
    "Sequence[str]",
    "Item | None",
    "TokenArray",
)
_LEVELS = ("DEBUG", "INFO", "INFO", "INFO", "WARNING", "ERROR")
_EXCEPTIONS = (
    "ValueError",
    "KeyError",
    "TimeoutError",
    "RuntimeError",
    "AssertionError",
    "ConnectionResetError",
    "json.JSONDecodeError",
)
_SENTENCES = (
    "The {m} calls {v} on the {n} twice when it retries after a timeout.",
    "We should {v} the {n} once per turn and keep the result in the {m} cache.",
    "The test fails because nobody calls {v} on the {n} from the {m} module before use.",
    "Make sure the {n} survives a reconnect; the {m} currently drops it.",
    "Latency grows with the length of the {n} history, which points at the {m}.",
    "Please {v} the {n} in place instead of copying it on every call.",
    "Keep the public API of the {m} unchanged; callers depend on the {n} shape.",
    "When the {n} is empty the {m} should {v} nothing and return early.",
)


def _ident(rng: random.Random) -> str:
    return f"{rng.choice(_VERBS)}_{rng.choice(NOUNS)}"


def file_path(rng: random.Random) -> str:
    return f"src/{rng.choice(MODULES)}/{rng.choice(NOUNS)}_{rng.choice(_VERBS)}.py"


def sentence(rng: random.Random) -> str:
    return rng.choice(_SENTENCES).format(
        n=rng.choice(NOUNS), v=rng.choice(_VERBS), m=rng.choice(MODULES)
    )


# -- generated texts ----------------------------------------------------------------------


def _python_function(rng: random.Random) -> str:
    name = _ident(rng)
    args = [f"{rng.choice(NOUNS)}: {rng.choice(_TYPES)}" for _ in range(rng.randint(1, 3))]
    ret = rng.choice(_TYPES)
    lines = [f"def {name}(self, {', '.join(args)}) -> {ret}:", f'    """{sentence(rng)}"""']
    for _ in range(rng.randint(3, 9)):
        var = rng.choice(NOUNS)
        choice = rng.randrange(5)
        if choice == 0:
            lines.append(f"    if {var} is None or len({var}) > {rng.randint(2, 4096)}:")
            lines.append(f'        raise {rng.choice(_EXCEPTIONS)}(f"bad {var}: {{{var}!r}}")')
        elif choice == 1:
            lines.append(f"    for index, {var} in enumerate(self.{rng.choice(NOUNS)}s):")
            lines.append(f"        self._{_ident(rng)}(index, {var})")
        elif choice == 2:
            lines.append(f"    {var} = self.{rng.choice(MODULES)}.{_ident(rng)}({var})")
        elif choice == 3:
            lines.append(f"    # {sentence(rng)}")
            lines.append(f"    self.{var}_count += {rng.randint(1, 64)}")
        else:
            lines.append(f"    await self.{rng.choice(NOUNS)}.{rng.choice(_VERBS)}({var})")
    lines.append(f"    return {rng.choice(NOUNS)}")
    return "\n".join(lines) + "\n\n"


def _source_file(rng: random.Random) -> str:
    head = [
        f"# {file_path(rng)}",
        f'"""{sentence(rng)}"""',
        "",
        "from __future__ import annotations",
        "",
        "import asyncio",
        f"from typing import Any, {rng.choice(('Sequence', 'Mapping', 'Iterable'))}",
        "",
        f"from app.{rng.choice(MODULES)} import {_ident(rng)}, {_ident(rng)}",
        "",
        "",
        f"class {rng.choice(NOUNS).title()}{rng.choice(_VERBS).title()}er:",
        f'    """{sentence(rng)}"""',
        "",
    ]
    body = "".join(
        "    " + line + "\n" if line else "\n"
        for _ in range(rng.randint(2, 4))
        for line in _python_function(rng).splitlines()
    )
    return "\n".join(head) + "\n" + body


def _log_excerpt(rng: random.Random) -> str:
    minute = rng.randint(0, 59)
    second = rng.random() * 60
    lines = []
    for _ in range(rng.randint(8, 24)):
        second += rng.random() * 0.4
        stamp = f"2025-03-14 10:{minute:02d}:{second:06.3f}"
        level = rng.choice(_LEVELS)
        module = rng.choice(MODULES)
        kind = rng.randrange(4)
        if kind == 0:
            msg = (
                f"{rng.choice(_VERBS)} {rng.choice(NOUNS)} id={rng.getrandbits(32):08x} "
                f"tokens={rng.randint(1, 200_000)} elapsed_ms={rng.random() * 90:.2f}"
            )
        elif kind == 1:
            msg = (
                f"GET /v1/{rng.choice(NOUNS)}s/{rng.getrandbits(24):06x} -> "
                f"{rng.choice((200, 200, 200, 404, 409, 500))} in {rng.randint(1, 900)}ms"
            )
        elif kind == 2:
            msg = (
                f"{rng.choice(_EXCEPTIONS)}: {rng.choice(NOUNS)} "
                f"{rng.choice(('not found', 'timed out', 'already closed', 'too large'))}"
            )
        else:
            msg = sentence(rng)
        lines.append(f"{stamp} {level:<7} {module}: {msg}")
    return "\n".join(lines) + "\n"


def _pytest_run(rng: random.Random) -> str:
    tests = rng.randint(20, 180)
    failed = rng.randint(0, 3)
    lines = ["$ python -m pytest -q tests/" + rng.choice(MODULES)]
    dots = "".join(rng.choice("....................F.s") for _ in range(tests))
    lines += [dots[i : i + 72] for i in range(0, len(dots), 72)]
    for _ in range(failed):
        test = f"tests/{rng.choice(MODULES)}/test_{_ident(rng)}.py::test_{_ident(rng)}"
        lines += [
            "",
            f"___ {test} ___",
            "",
            f"    def test_{_ident(rng)}():",
            f">       assert {rng.choice(NOUNS)}.{rng.choice(NOUNS)} == {rng.randint(0, 999)}",
            f"E       AssertionError: assert {rng.randint(0, 999)} == {rng.randint(0, 999)}",
            "",
            f"{file_path(rng)}:{rng.randint(10, 900)}: AssertionError",
        ]
    lines.append(f"{failed} failed, {tests - failed} passed in {rng.random() * 20:.2f}s")
    return "\n".join(lines) + "\n"


def _grep_hits(rng: random.Random) -> str:
    word = rng.choice(NOUNS)
    lines = [f"$ rg -n '{word}' src/"]
    for _ in range(rng.randint(6, 20)):
        lines.append(
            f"{file_path(rng)}:{rng.randint(1, 1200)}:        "
            f"{rng.choice(NOUNS)} = self.{word}.{_ident(rng)}({rng.choice(NOUNS)})"
        )
    return "\n".join(lines) + "\n"


def unified_diff(rng: random.Random) -> str:
    path = file_path(rng)
    start = rng.randint(1, 800)
    lines = [
        f"diff --git a/{path} b/{path}",
        f"--- a/{path}",
        f"+++ b/{path}",
        f"@@ -{start},9 +{start},10 @@ def {_ident(rng)}(self):",
    ]
    for _ in range(rng.randint(5, 12)):
        sign = rng.choice("  -+")
        lines.append(f"{sign}        {rng.choice(NOUNS)} = {_ident(rng)}({rng.choice(NOUNS)})")
    return "\n".join(lines) + "\n"


def _listing(rng: random.Random) -> str:
    lines = [f"$ ls -la src/{rng.choice(MODULES)}", f"total {rng.randint(40, 400)}"]
    for _ in range(rng.randint(5, 14)):
        lines.append(
            f"-rw-r--r--  1 dev dev {rng.randint(120, 48000):>6} Mar 14 "
            f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} "
            f"{rng.choice(NOUNS)}_{rng.choice(_VERBS)}.py"
        )
    return "\n".join(lines) + "\n"


_TOOL_BLOCKS = (
    _source_file,
    _source_file,
    _log_excerpt,
    _log_excerpt,
    _pytest_run,
    _grep_hits,
    unified_diff,
    _listing,
)


def tool_output_blocks(rng: random.Random) -> Callable[[], str]:
    return lambda: rng.choice(_TOOL_BLOCKS)(rng)


def _intro_then(intro: str, more: Callable[[], str]) -> Callable[[], str]:
    """A block source that yields ``intro`` once, then whatever ``more`` makes."""
    pending = [intro]

    def block() -> str:
        return pending.pop() if pending else more()

    return block


def instructions_blocks(rng: random.Random) -> Callable[[], str]:
    return _intro_then(
        "You are a coding agent working in the user's repository. You read code, run "
        "commands and tests, and edit files until the task is done. Be precise and brief.\n\n"
        "# Rules\n",
        lambda: f"- {sentence(rng)} {sentence(rng)}\n",
    )


def user_blocks(rng: random.Random) -> Callable[[], str]:
    return _intro_then(
        "The integration tests started failing after the last merge, and turns got slower as "
        "conversations grow. Find the cause, fix it, and make the test suite pass. Here is "
        "what I saw:\n\n",
        lambda: rng.choice((_log_excerpt, _pytest_run, lambda r: sentence(r) + "\n"))(rng),
    )
