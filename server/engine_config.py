"""The engines' settings, as the server's configuration reads them (TOML: ``[sim]`` and a
model route's ``[models.NAME.completions]`` or ``[models.NAME.upstream]``).

They sit beside the configuration, not in ``engines``, so that reading a configuration loads
no engine, and the core, which reads the configuration, depends on no engine. The engines take
them when they are built (``engines.build_engine``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bidi_responses.schema import JSONObject

__all__ = ["CompletionsConfig", "EngineTiming", "SimConfig", "UpstreamConfig"]


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


@dataclass(slots=True)
class CompletionsConfig:
    """One model route served by an OpenAI-compatible completions backend (TOML:
    ``[models.NAME.completions]``)."""

    # The backend's OpenAI base URL; the engine posts to ``{base_url}/completions``.
    base_url: str = "http://127.0.0.1:8080/v1"
    # The backend's model name; empty sends none (a backend serving one model uses it).
    model: str = ""
    # Environment variable holding the backend's API key (sent as a bearer token); empty: none.
    api_key_env: str = ""
    connect_timeout_s: float = 5.0
    # From sending the request to the first streamed chunk: queueing plus prefill.
    first_token_timeout_s: float = 120.0
    # The longest silence between two streamed chunks.
    idle_timeout_s: float = 30.0
    # Attempts after the first, only while no token has been streamed.
    max_retries: int = 2
    retry_backoff_s: float = 0.25
    # Most tokens one sampling segment may produce (the request's budget may lower it).
    max_output_tokens: int = 4096
    # The backend's context window: prompt plus output budget must fit.
    context_window: int = 131_072
    # Connections kept open to the backend.
    max_connections: int = 64
    # The model's chat format: "generic" (the project's own), "harmony" (gpt-oss) or
    # "template" (any open model: its own tokenizer and chat template, from the files below).
    format: str = "generic"
    # format = "template": the model's tokenizer.json, its directory, or its GGUF file (a
    # relative path is taken from the config file's directory).
    tokenizer: str = ""
    # A .jinja file replacing the model's own chat template ("" keeps the model's).
    chat_template: str = ""
    # How the model writes tool calls: "auto" (from its template), "tags", "json" or "none".
    tool_call_format: str = "auto"
    # Extra variables for the chat template (``chat_template_kwargs``: enable_thinking...).
    chat_template_kwargs: JSONObject = field(default_factory=dict)
    # Extra fields merged into every request body (backend sampling settings, logit_bias...).
    extra_body: JSONObject = field(default_factory=dict)


@dataclass(slots=True)
class UpstreamConfig:
    """One model route served by an upstream Responses API (TOML: ``[models.NAME.upstream]``)."""

    # The upstream's OpenAI base URL: HTTP posts go to {base_url}/responses, WebSocket mode
    # connects to the same path with ws:// (wss:// for https://).
    base_url: str = "http://127.0.0.1:8000/v1"
    # The upstream model name (required by most upstreams).
    model: str = ""
    # Environment variable holding the upstream's API key (bearer token); empty: none.
    api_key_env: str = ""
    # "auto" (WebSocket mode, HTTP if the upgrade is refused), "websocket" or "http".
    transport: str = "auto"
    # Ask the upstream to store responses (then HTTP turns chain previous_response_id too).
    store: bool = False
    connect_timeout_s: float = 10.0
    first_event_timeout_s: float = 120.0
    idle_timeout_s: float = 60.0
    max_retries: int = 2
    retry_backoff_s: float = 0.25
    max_message_bytes: int = 64 * 1024 * 1024
