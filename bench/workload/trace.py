"""Recorded traces in the ``script`` engine's format: written from a seed, counted when read."""

from __future__ import annotations

import json
import random
from pathlib import Path

from ..jsontypes import JSONObject
from .texts import MODULES, NOUNS, file_path, sentence, unified_diff
from .tools import agent_tools

__all__ = ["load_trace_turns", "write_trace"]


def write_trace(
    path: str | Path,
    tool_turns: int,
    *,
    seed: int = 0,
    answer: str = "The fix is in place and the test suite passes.",
) -> Path:
    """Write a script-engine trace: ``tool_turns`` function-call turns, then an answer."""
    rng = random.Random(f"bench-trace:{seed}")
    names = [t["name"] for t in agent_tools() if t["name"] != "update_plan"]
    lines = []
    for turn in range(tool_turns):
        name = rng.choice(names)
        arguments: JSONObject
        if name == "exec_command":
            arguments = {"cmd": f"python -m pytest -q tests/{rng.choice(MODULES)} -x"}
        elif name in ("read_file", "list_dir", "write_file"):
            arguments = {"path": file_path(rng)}
            if name == "write_file":
                arguments["content"] = sentence(rng)
        elif name == "apply_patch":
            arguments = {"patch": unified_diff(rng)}
        elif name == "grep_search":
            arguments = {"pattern": rng.choice(NOUNS)}
        else:
            arguments = {"selector": rng.choice(NOUNS)}
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
