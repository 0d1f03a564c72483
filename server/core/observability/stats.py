"""What one response counted on the server (``response.stats``): items checked, tokens
rendered and reused, time before, in and after the engine. The run fills it; the metrics and
the process's counters read it."""

from __future__ import annotations

from dataclasses import dataclass, field

from bidi_responses.schema import StatsObject


@dataclass(slots=True)
class ResponseStats:
    """Server-side counters of one response (exposed as ``response.stats``)."""

    items_validated: int = 0
    tokens_rendered: int = 0
    tokens_reused: int = 0
    prefill_tokens: int = 0
    engine_ms: float = 0.0
    api_pre_ms: float = 0.0
    api_post_ms: float = 0.0
    route_resolved: bool = False
    stage_items: dict[str, int] = field(default_factory=dict)
    stage_ms: dict[str, float] = field(default_factory=dict)
    pre_inference_runs: int = 0
    engine_runs: int = 0
    # What a real backend reported: prompt tokens it received, and how many of those its own
    # prefix (KV) cache served (0 on engines that report nothing).
    engine_prompt_tokens: int = 0
    engine_cached_tokens: int = 0

    def to_dict(self) -> StatsObject:
        """JSON form, with times rounded to microseconds."""
        return {
            "items_validated": self.items_validated,
            "tokens_rendered": self.tokens_rendered,
            "tokens_reused": self.tokens_reused,
            "prefill_tokens": self.prefill_tokens,
            "engine_ms": round(self.engine_ms, 3),
            "api_pre_ms": round(self.api_pre_ms, 3),
            "api_post_ms": round(self.api_post_ms, 3),
            "route_resolved": self.route_resolved,
            "stage_items": dict(self.stage_items),
            "stage_ms": {k: round(v, 3) for k, v in self.stage_ms.items()},
            "pre_inference_runs": self.pre_inference_runs,
            "engine_runs": self.engine_runs,
            "engine_prompt_tokens": self.engine_prompt_tokens,
            "engine_cached_tokens": self.engine_cached_tokens,
        }
