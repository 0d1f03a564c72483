"""The rollouts: the headline agent session and the history sweep's prefilled conversations."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from ..jsontypes import JSONObject
from .texts import (
    TokenCounter,
    fit,
    instructions_blocks,
    tool_output_blocks,
    user_blocks,
)
from .tools import agent_tools

__all__ = [
    "HistoryWorkload",
    "Workload",
    "WorkloadSpec",
    "build_history_workload",
    "build_workload",
    "count_tokens",
    "user_item",
]


def user_item(text: str) -> JSONObject:
    """A user message input item."""
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


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
    tools: list[JSONObject]
    user_text: str
    #: ``tool_outputs[i]`` answers the model's call in tool turn ``i`` (0-based).
    tool_outputs: list[str]
    #: Token counts, for the record: instructions, tools (as rendered JSON), user, outputs.
    tokens: dict[str, int] = field(default_factory=dict)

    def tool_output(self, turn: int) -> str:
        """The output for tool turn ``turn``; turns past the generated ones wrap around."""
        return self.tool_outputs[turn % len(self.tool_outputs)]

    def user_message(self, nonce: str = "") -> JSONObject:
        """The first user message; ``nonce`` makes a rollout's prompt unique.

        A unique first message keeps the engine's prefix cache honest across repeats: the
        shared instructions and tools stay cached (as a hosted API caches a system prompt),
        but each rollout's own history is new to the engine and pays its prefill.
        """
        return user_item(f"Session {nonce}.\n\n{self.user_text}" if nonce else self.user_text)

    def to_json(self) -> JSONObject:
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
    from bidi_responses.server.core.rendering.tokenizer import load_encoding

    encode = load_encoding().encode_ordinary
    return lambda text: len(encode(text))


def build_workload(spec: WorkloadSpec, counter: TokenCounter | None = None) -> Workload:
    """Generate the rollout for ``spec`` (deterministic in ``spec.seed``)."""
    counter = counter or count_tokens()
    rng = random.Random(f"bench-workload:{spec.seed}")
    instructions = fit(instructions_blocks(rng), spec.instructions_tokens, counter)
    tools = agent_tools()
    user_text = fit(user_blocks(rng), spec.user_tokens, counter)
    outputs = [
        fit(
            tool_output_blocks(random.Random(f"bench-tool:{spec.seed}:{i}")),
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
    tools: list[JSONObject]
    user_text: str
    #: Tool outputs that fill the history (``chunk_tokens`` each).
    chunks: list[str]
    chunk_tokens: int
    #: Outputs of the measured small turns.
    small_outputs: list[str]
    base_tokens: int

    def history(self, target_tokens: int) -> list[JSONObject]:
        """Input items: the user message, then call/output pairs up to ``target_tokens``."""
        items: list[JSONObject] = [user_item(self.user_text)]
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
    instructions = fit(instructions_blocks(rng), 250, counter)
    tools = [t for t in agent_tools() if t["name"] == "exec_command"]
    user_text = fit(user_blocks(rng), 500, counter)
    count = max(1, max_tokens // (chunk_tokens + 30) + 1)
    chunks = [
        fit(
            tool_output_blocks(random.Random(f"bench-history-chunk:{seed}:{i}")),
            chunk_tokens,
            counter,
        )
        for i in range(min(count, 16))  # 16 distinct chunks repeat; enough variety
    ]
    small = [
        fit(
            tool_output_blocks(random.Random(f"bench-history-small:{seed}:{i}")),
            small_tokens,
            counter,
        )
        for i in range(small_turns)
    ]
    tools_json = json.dumps(tools, separators=(",", ":"), sort_keys=True)
    base = counter(instructions) + counter(tools_json) + counter(user_text) + 20
    return HistoryWorkload(instructions, tools, user_text, chunks, chunk_tokens, small, base)
