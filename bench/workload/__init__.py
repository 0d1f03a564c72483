"""The benchmark's rollouts: a synthetic coding-agent session, generated from a seed.

A rollout is what a coding agent sends while it fixes a bug: instructions and tool
definitions (about 2k tokens together), a first user message (about 1k tokens), then one tool
output per tool turn. Tool outputs are about ``tool_output_tokens`` tokens of text that looks
like what tools really return: source files, test runs, log excerpts, grep hits, diffs and
directory listings, mixed at random. Everything is a pure function of the seed, so every mode
replays byte-identical inputs, and nothing is downloaded.

Token counts use the project's own tokenizer (``core.rendering.tokenizer.load_encoding``), the one
the
server renders with, so "a 4k-token tool output" means 4k tokens on the server too.

``write_trace`` writes a rollout's model turns in the ``script`` engine's JSONL format, for
replaying a recorded trace instead of the simulated model.

The package, one job per module: ``texts`` (the generators and fitting a text to a token
count), ``tools`` (the agent's tool definitions), ``rollout`` (the rollouts built from them)
and ``trace`` (the script engine's traces).
"""

from __future__ import annotations

from .rollout import (
    HistoryWorkload,
    Workload,
    WorkloadSpec,
    build_history_workload,
    build_workload,
    count_tokens,
    user_item,
)
from .texts import TokenCounter
from .trace import load_trace_turns, write_trace

__all__ = [
    "HistoryWorkload",
    "TokenCounter",
    "Workload",
    "WorkloadSpec",
    "build_history_workload",
    "build_workload",
    "count_tokens",
    "load_trace_turns",
    "user_item",
    "write_trace",
]
