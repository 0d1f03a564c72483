"""The benchmark's rollouts: a synthetic coding-agent session, generated from a seed.

A rollout is what a coding agent sends while it fixes a bug: instructions and tool
definitions (about 2k tokens together), a first user message (about 1k tokens), then one tool
output per tool turn. Tool outputs are about ``tool_output_tokens`` tokens of text that looks
like what tools really return: source files, test runs, log excerpts, grep hits, diffs and
directory listings, mixed at random. Everything is a pure function of the seed, so every mode
replays byte-identical inputs, and nothing is downloaded.

Token counts use the project's own tokenizer (``core.tokenizer.load_encoding``), the one the
server renders with, so "a 4k-token tool output" means 4k tokens on the server too.

``write_trace`` writes a rollout's model turns in the ``script`` engine's JSONL format, for
replaying a recorded trace instead of the simulated model.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "HistoryWorkload",
    "Workload",
    "WorkloadSpec",
    "build_history_workload",
    "build_workload",
    "count_tokens",
    "load_trace_turns",
    "write_trace",
]

TokenCounter = Callable[[str], int]


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """The shape of one rollout (the defaults are the protocol's headline rollout)."""

    seed: int = 0
    #: Tool turns before the final answer (the server's sim must be set to the same count).
    tool_turns: int = 25
    #: Size of each tool output, in o200k tokens.
    tool_output_tokens: int = 4000
    #: Size of the first user message, in tokens.
    user_tokens: int = 1000
    #: Size of the system instructions, in tokens (the tool definitions add about 700 more).
    instructions_tokens: int = 1300
    #: Client-side tool execution time per call, milliseconds (0 measures pure overhead).
    tool_ms: float = 0.0


@dataclass(slots=True)
class Workload:
    """A generated rollout: everything a client sends, in the order it sends it."""

    spec: WorkloadSpec
    instructions: str
    tools: list[dict[str, Any]]
    user_text: str
    #: ``tool_outputs[i]`` answers the model's call in tool turn ``i`` (0-based).
    tool_outputs: list[str]
    #: Token counts, for the record: instructions, tools (as rendered JSON), user, outputs.
    tokens: dict[str, int] = field(default_factory=dict)

    def tool_output(self, turn: int) -> str:
        """The output for tool turn ``turn``; turns past the generated ones wrap around."""
        return self.tool_outputs[turn % len(self.tool_outputs)]

    def user_message(self, nonce: str = "") -> dict[str, Any]:
        """The first user message; ``nonce`` makes a rollout's prompt unique.

        A unique first message keeps the engine's prefix cache honest across repeats: the
        shared instructions and tools stay cached (as a hosted API caches a system prompt),
        but each rollout's own history is new to the engine and pays its prefill.
        """
        text = f"Session {nonce}.\n\n{self.user_text}" if nonce else self.user_text
        return {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        }

    def to_json(self) -> dict[str, Any]:
        """A compact description (not the texts) for the results file."""
        return {
            "seed": self.spec.seed,
            "tool_turns": self.spec.tool_turns,
            "tool_output_tokens": self.spec.tool_output_tokens,
            "tool_ms": self.spec.tool_ms,
            "tokens": dict(self.tokens),
        }


def count_tokens() -> TokenCounter:
    """A token counter with the server's encoding (loaded once per process)."""
    from bidi_responses.server.core.tokenizer import load_encoding

    encode = load_encoding().encode_ordinary
    return lambda text: len(encode(text))


def build_workload(spec: WorkloadSpec, counter: TokenCounter | None = None) -> Workload:
    """Generate the rollout for ``spec`` (deterministic in ``spec.seed``)."""
    counter = counter or count_tokens()
    rng = random.Random(f"bench-workload:{spec.seed}")
    instructions = _fit(_instructions_blocks(rng), spec.instructions_tokens, counter)
    tools = _tools()
    user_text = _fit(_user_blocks(rng), spec.user_tokens, counter)
    outputs = [
        _fit(
            _tool_output_blocks(random.Random(f"bench-tool:{spec.seed}:{i}")),
            spec.tool_output_tokens,
            counter,
        )
        for i in range(max(spec.tool_turns, 1))
    ]
    tools_json = json.dumps(tools, separators=(",", ":"), sort_keys=True)
    return Workload(
        spec=spec,
        instructions=instructions,
        tools=tools,
        user_text=user_text,
        tool_outputs=outputs,
        tokens={
            "instructions": counter(instructions),
            "tools": counter(tools_json),
            "user": counter(user_text),
            "tool_output": counter(outputs[0]),
        },
    )


@dataclass(slots=True)
class HistoryWorkload:
    """The history-length sweep: a conversation prefilled to a size, then small turns.

    The prompt is kept small apart from the history (short instructions, one tool, a short
    user message: about 1k tokens together), so that the smallest point really is ~1k tokens.
    """

    instructions: str
    tools: list[dict[str, Any]]
    user_text: str
    #: Tool outputs that fill the history (``chunk_tokens`` each).
    chunks: list[str]
    chunk_tokens: int
    #: Outputs of the measured small turns.
    small_outputs: list[str]
    base_tokens: int

    def history(self, target_tokens: int) -> list[dict[str, Any]]:
        """Input items: the user message, then call/output pairs up to ``target_tokens``."""
        items: list[dict[str, Any]] = [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": self.user_text}],
            }
        ]
        total = self.base_tokens
        index = 0
        # A pair costs its output plus ~30 tokens of call and framing.
        while total + self.chunk_tokens // 2 < target_tokens:
            call_id = f"call_prefill_{index:04d}"
            items.append(
                {
                    "type": "function_call",
                    "call_id": call_id,
                    "name": "exec_command",
                    "arguments": '{"cmd":"python -m pytest -q -x"}',
                }
            )
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": call_id,
                    "output": self.chunks[index % len(self.chunks)],
                }
            )
            total += self.chunk_tokens + 30
            index += 1
        return items


def build_history_workload(
    seed: int = 0,
    *,
    max_tokens: int = 200_000,
    chunk_tokens: int = 4000,
    small_tokens: int = 256,
    small_turns: int = 8,
    counter: TokenCounter | None = None,
) -> HistoryWorkload:
    """Generate the history sweep's texts (deterministic in ``seed``)."""
    counter = counter or count_tokens()
    rng = random.Random(f"bench-history:{seed}")
    instructions = _fit(_instructions_blocks(rng), 250, counter)
    tools = [t for t in _tools() if t["name"] == "exec_command"]
    user_text = _fit(_user_blocks(rng), 500, counter)
    count = max(1, max_tokens // (chunk_tokens + 30) + 1)
    chunks = [
        _fit(
            _tool_output_blocks(random.Random(f"bench-history-chunk:{seed}:{i}")),
            chunk_tokens,
            counter,
        )
        for i in range(min(count, 16))  # 16 distinct chunks repeat; enough variety
    ]
    small = [
        _fit(
            _tool_output_blocks(random.Random(f"bench-history-small:{seed}:{i}")),
            small_tokens,
            counter,
        )
        for i in range(small_turns)
    ]
    tools_json = json.dumps(tools, separators=(",", ":"), sort_keys=True)
    base = counter(instructions) + counter(tools_json) + counter(user_text) + 20
    return HistoryWorkload(instructions, tools, user_text, chunks, chunk_tokens, small, base)


def _fit(blocks: Callable[[], str], target: int, counter: TokenCounter) -> str:
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


# -- vocabulary ---------------------------------------------------------------------------

_MODULES = (
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
_NOUNS = (
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
    return f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}"


def _path(rng: random.Random) -> str:
    return f"src/{rng.choice(_MODULES)}/{rng.choice(_NOUNS)}_{rng.choice(_VERBS)}.py"


def _sentence(rng: random.Random) -> str:
    return rng.choice(_SENTENCES).format(
        n=rng.choice(_NOUNS), v=rng.choice(_VERBS), m=rng.choice(_MODULES)
    )


# -- generated texts ----------------------------------------------------------------------


def _python_function(rng: random.Random) -> str:
    name = _ident(rng)
    args = [f"{rng.choice(_NOUNS)}: {rng.choice(_TYPES)}" for _ in range(rng.randint(1, 3))]
    ret = rng.choice(_TYPES)
    lines = [f"def {name}(self, {', '.join(args)}) -> {ret}:", f'    """{_sentence(rng)}"""']
    for _ in range(rng.randint(3, 9)):
        var = rng.choice(_NOUNS)
        choice = rng.randrange(5)
        if choice == 0:
            lines.append(f"    if {var} is None or len({var}) > {rng.randint(2, 4096)}:")
            lines.append(f'        raise {rng.choice(_EXCEPTIONS)}(f"bad {var}: {{{var}!r}}")')
        elif choice == 1:
            lines.append(f"    for index, {var} in enumerate(self.{rng.choice(_NOUNS)}s):")
            lines.append(f"        self._{_ident(rng)}(index, {var})")
        elif choice == 2:
            lines.append(f"    {var} = self.{rng.choice(_MODULES)}.{_ident(rng)}({var})")
        elif choice == 3:
            lines.append(f"    # {_sentence(rng)}")
            lines.append(f"    self.{var}_count += {rng.randint(1, 64)}")
        else:
            lines.append(f"    await self.{rng.choice(_NOUNS)}.{rng.choice(_VERBS)}({var})")
    lines.append(f"    return {rng.choice(_NOUNS)}")
    return "\n".join(lines) + "\n\n"


def _source_file(rng: random.Random) -> str:
    head = [
        f"# {_path(rng)}",
        f'"""{_sentence(rng)}"""',
        "",
        "from __future__ import annotations",
        "",
        "import asyncio",
        f"from typing import Any, {rng.choice(('Sequence', 'Mapping', 'Iterable'))}",
        "",
        f"from app.{rng.choice(_MODULES)} import {_ident(rng)}, {_ident(rng)}",
        "",
        "",
        f"class {rng.choice(_NOUNS).title()}{rng.choice(_VERBS).title()}er:",
        f'    """{_sentence(rng)}"""',
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
        module = rng.choice(_MODULES)
        kind = rng.randrange(4)
        if kind == 0:
            msg = (
                f"{rng.choice(_VERBS)} {rng.choice(_NOUNS)} id={rng.getrandbits(32):08x} "
                f"tokens={rng.randint(1, 200_000)} elapsed_ms={rng.random() * 90:.2f}"
            )
        elif kind == 1:
            msg = (
                f"GET /v1/{rng.choice(_NOUNS)}s/{rng.getrandbits(24):06x} -> "
                f"{rng.choice((200, 200, 200, 404, 409, 500))} in {rng.randint(1, 900)}ms"
            )
        elif kind == 2:
            msg = (
                f"{rng.choice(_EXCEPTIONS)}: {rng.choice(_NOUNS)} "
                f"{rng.choice(('not found', 'timed out', 'already closed', 'too large'))}"
            )
        else:
            msg = _sentence(rng)
        lines.append(f"{stamp} {level:<7} {module}: {msg}")
    return "\n".join(lines) + "\n"


def _pytest_run(rng: random.Random) -> str:
    tests = rng.randint(20, 180)
    failed = rng.randint(0, 3)
    lines = ["$ python -m pytest -q tests/" + rng.choice(_MODULES)]
    dots = "".join(rng.choice("....................F.s") for _ in range(tests))
    lines += [dots[i : i + 72] for i in range(0, len(dots), 72)]
    for _ in range(failed):
        test = f"tests/{rng.choice(_MODULES)}/test_{_ident(rng)}.py::test_{_ident(rng)}"
        lines += [
            "",
            f"___ {test} ___",
            "",
            f"    def test_{_ident(rng)}():",
            f">       assert {rng.choice(_NOUNS)}.{rng.choice(_NOUNS)} == {rng.randint(0, 999)}",
            f"E       AssertionError: assert {rng.randint(0, 999)} == {rng.randint(0, 999)}",
            "",
            f"{_path(rng)}:{rng.randint(10, 900)}: AssertionError",
        ]
    lines.append(f"{failed} failed, {tests - failed} passed in {rng.random() * 20:.2f}s")
    return "\n".join(lines) + "\n"


def _grep_hits(rng: random.Random) -> str:
    word = rng.choice(_NOUNS)
    lines = [f"$ rg -n '{word}' src/"]
    for _ in range(rng.randint(6, 20)):
        lines.append(
            f"{_path(rng)}:{rng.randint(1, 1200)}:        "
            f"{rng.choice(_NOUNS)} = self.{word}.{_ident(rng)}({rng.choice(_NOUNS)})"
        )
    return "\n".join(lines) + "\n"


def _diff(rng: random.Random) -> str:
    path = _path(rng)
    start = rng.randint(1, 800)
    lines = [
        f"diff --git a/{path} b/{path}",
        f"--- a/{path}",
        f"+++ b/{path}",
        f"@@ -{start},9 +{start},10 @@ def {_ident(rng)}(self):",
    ]
    for _ in range(rng.randint(5, 12)):
        sign = rng.choice("  -+")
        lines.append(f"{sign}        {rng.choice(_NOUNS)} = {_ident(rng)}({rng.choice(_NOUNS)})")
    return "\n".join(lines) + "\n"


def _listing(rng: random.Random) -> str:
    lines = [f"$ ls -la src/{rng.choice(_MODULES)}", f"total {rng.randint(40, 400)}"]
    for _ in range(rng.randint(5, 14)):
        lines.append(
            f"-rw-r--r--  1 dev dev {rng.randint(120, 48000):>6} Mar 14 "
            f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} "
            f"{rng.choice(_NOUNS)}_{rng.choice(_VERBS)}.py"
        )
    return "\n".join(lines) + "\n"


_TOOL_BLOCKS = (
    _source_file,
    _source_file,
    _log_excerpt,
    _log_excerpt,
    _pytest_run,
    _grep_hits,
    _diff,
    _listing,
)


def _tool_output_blocks(rng: random.Random) -> Callable[[], str]:
    return lambda: rng.choice(_TOOL_BLOCKS)(rng)


def _intro_then(intro: str, more: Callable[[], str]) -> Callable[[], str]:
    """A block source that yields ``intro`` once, then whatever ``more`` makes."""
    pending = [intro]

    def block() -> str:
        return pending.pop() if pending else more()

    return block


def _instructions_blocks(rng: random.Random) -> Callable[[], str]:
    return _intro_then(
        "You are a coding agent working in the user's repository. You read code, run "
        "commands and tests, and edit files until the task is done. Be precise and brief.\n\n"
        "# Rules\n",
        lambda: f"- {_sentence(rng)} {_sentence(rng)}\n",
    )


def _user_blocks(rng: random.Random) -> Callable[[], str]:
    return _intro_then(
        "The integration tests started failing after the last merge, and turns got slower as "
        "conversations grow. Find the cause, fix it, and make the test suite pass. Here is "
        "what I saw:\n\n",
        lambda: rng.choice((_log_excerpt, _pytest_run, lambda r: _sentence(r) + "\n"))(rng),
    )


def _tools() -> list[dict[str, Any]]:
    """Eight tool definitions of a coding agent (about 1k tokens as JSON)."""

    def tool(
        name: str, description: str, properties: dict[str, Any], required: Sequence[str]
    ) -> dict[str, Any]:
        return {
            "type": "function",
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(required),
                "additionalProperties": False,
            },
            "strict": False,
        }

    text = {"type": "string"}
    return [
        tool(
            "exec_command",
            "Run a shell command in the repository and return its combined "
            "stdout and stderr. Use it for builds, tests, git and inspection commands.",
            {
                "cmd": {"type": "string", "description": "The command line to run."},
                "workdir": {"type": "string", "description": "Directory to run in."},
                "timeout_ms": {"type": "integer", "minimum": 100, "maximum": 600000},
            },
            ["cmd"],
        ),
        tool(
            "read_file",
            "Read a file (or a range of its lines) from the repository.",
            {
                "path": {"type": "string", "description": "Path relative to the root."},
                "start_line": {"type": "integer", "minimum": 1},
                "end_line": {"type": "integer", "minimum": 1},
            },
            ["path"],
        ),
        tool(
            "apply_patch",
            "Apply a unified diff to the repository. The patch must apply "
            "cleanly; on failure nothing is changed and the conflicts are reported.",
            {
                "patch": {"type": "string", "description": "The unified diff."},
                "reason": {"type": "string", "description": "Why the change is needed."},
            },
            ["patch"],
        ),
        tool(
            "list_dir",
            "List the entries of a directory with sizes and types.",
            {"path": text, "depth": {"type": "integer", "minimum": 1, "maximum": 5}},
            ["path"],
        ),
        tool(
            "grep_search",
            "Search the repository for a regular expression and return the "
            "matching lines with file names and line numbers.",
            {
                "pattern": {"type": "string", "description": "A ripgrep regular expression."},
                "path": text,
                "max_results": {"type": "integer", "minimum": 1, "maximum": 1000},
            },
            ["pattern"],
        ),
        tool(
            "run_tests",
            "Run the project's test suite, or a subset selected by expression, "
            "and return the report.",
            {
                "selector": {"type": "string", "description": "A pytest -k expression."},
                "verbose": {"type": "boolean"},
            },
            [],
        ),
        tool(
            "write_file",
            "Create or overwrite a file with the given content.",
            {"path": text, "content": {"type": "string", "description": "The new content."}},
            ["path", "content"],
        ),
        tool(
            "update_plan",
            "Record the plan: the steps and which of them are done. Keep it "
            "short and current; the user sees it.",
            {
                "explanation": {"type": "string", "description": "What changed and why."},
                "steps": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "step": text,
                            "status": {
                                "type": "string",
                                "enum": ["pending", "in_progress", "completed"],
                            },
                        },
                        "required": ["step", "status"],
                    },
                },
            },
            ["steps"],
        ),
    ]


# -- recorded traces (the script engine's format) -----------------------------------------


def write_trace(
    path: str | Path,
    tool_turns: int,
    *,
    seed: int = 0,
    answer: str = "The fix is in place and the test suite passes.",
) -> Path:
    """Write a script-engine trace: ``tool_turns`` function-call turns, then an answer."""
    rng = random.Random(f"bench-trace:{seed}")
    names = [t["name"] for t in _tools() if t["name"] != "update_plan"]
    lines = []
    for turn in range(tool_turns):
        name = rng.choice(names)
        arguments: dict[str, Any]
        if name == "exec_command":
            arguments = {"cmd": f"python -m pytest -q tests/{rng.choice(_MODULES)} -x"}
        elif name in ("read_file", "list_dir", "write_file"):
            arguments = {"path": _path(rng)}
            if name == "write_file":
                arguments["content"] = _sentence(rng)
        elif name == "apply_patch":
            arguments = {"patch": _diff(rng)}
        elif name == "grep_search":
            arguments = {"pattern": rng.choice(_NOUNS)}
        else:
            arguments = {"selector": rng.choice(_NOUNS)}
        lines.append(
            {
                "comment": f"tool turn {turn}",
                "output": [{"type": "function_call", "name": name, "arguments": arguments}],
            }
        )
    lines.append({"output": [{"type": "message", "text": answer}]})
    target = Path(path)
    target.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return target


def load_trace_turns(path: str | Path) -> int:
    """How many tool turns a script-engine trace has before its first text-only turn."""
    from bidi_responses.server.engines.script import load_script

    turns = load_script(path)
    count = 0
    for items in turns:
        if not any(item.kind == "function_call" for item in items):
            break
        count += 1
    return count
