"""Settings of the simulated engines: the cost model's rates (``EngineTiming``, see
``timing``) and the simulated model's behaviour (``SimConfig``).

The server's configuration reads them without loading an engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["EngineTiming", "SimConfig"]


def _check_rate(name: str, value: float, *, allow_zero: bool = False) -> None:
    ok = math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


@dataclass(frozen=True, slots=True)
class EngineTiming:
    """The simulated engine's speed: decode rate, base time to first token, prefill rate."""

    tokens_per_second: float = 1000.0
    ttft_ms: float = 50.0
    prefill_tokens_per_second: float = 100_000.0

    def __post_init__(self) -> None:
        _check_rate("tokens_per_second", self.tokens_per_second)
        _check_rate("ttft_ms", self.ttft_ms, allow_zero=True)
        _check_rate("prefill_tokens_per_second", self.prefill_tokens_per_second)

    def ttft_seconds(self, uncached_prompt_tokens: int) -> float:
        """Time to first token: the fixed base plus prefill of the uncached prompt tokens."""
        return self.ttft_ms / 1000.0 + uncached_prompt_tokens / self.prefill_tokens_per_second

    def modeled_seconds(self, uncached_prompt_tokens: int, output_tokens: int) -> float:
        """Engine time of a whole segment: time to first token plus decoding ``output_tokens``."""
        return self.ttft_seconds(uncached_prompt_tokens) + output_tokens / self.tokens_per_second


@dataclass(slots=True)
class SimConfig:
    """Settings of the simulated engine; defaults are the benchmark's headline point.

    Mutable so that configuration files and flags can fill it in; ``SimEngine`` checks it
    again when it is built.
    """

    tokens_per_second: float = 1000.0
    ttft_ms: float = 50.0
    prefill_tokens_per_second: float = 100_000.0
    #: Tool-calling turns (since the last user message) before the model answers in text.
    tool_rounds: int = 3
    #: Target size of one function call's argument JSON, in tokens (reached when the schema
    #: has a free-form string property to pad).
    function_call_tokens: int = 40
    #: Size of the final text answer, in tokens.
    answer_tokens: int = 200
    seed: int = 0
    prefix_block_tokens: int = 64
    #: 65,536 blocks of 64 tokens remember about 4M prompt tokens.
    prefix_cache_max_blocks: int = 65_536

    def __post_init__(self) -> None:
        for name in ("tool_rounds", "function_call_tokens", "answer_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        # Validates the rates and fails early, at configuration time.
        self.timing()

    def timing(self) -> EngineTiming:
        """The pacing part of this config."""
        return EngineTiming(
            tokens_per_second=self.tokens_per_second,
            ttft_ms=self.ttft_ms,
            prefill_tokens_per_second=self.prefill_tokens_per_second,
        )
