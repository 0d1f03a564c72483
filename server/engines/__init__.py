"""Inference engines: plugins behind the core's engine port (``core.ports``: the ``Engine``
protocol and its request/event types), which is all they import from the core.

* ``sim``: ``SimEngine``, a deterministic simulated model (tool calls, then an answer);
  ``schema_sampler`` draws its tool arguments from the tools' JSON schemas.
* ``script``: ``ScriptEngine``, which replays model turns from a JSONL file.
* ``completions``: ``CompletionsEngine``, real inference on an OpenAI-compatible
  ``/v1/completions`` backend (vLLM, SGLang, llama.cpp), token ids in and out;
  ``completion_stream`` reads its streamed answer.
* ``upstream``: ``UpstreamResponsesEngine``, an upstream Responses API over WebSocket mode
  (HTTP as the fallback), chaining ``previous_response_id`` per stream lane; ``upstream_wire``
  speaks the two wires, ``upstream_events`` translates the upstream's events.
* ``http_backend``: what the two HTTP engines share (session pool, API key, SSE, errors).
* ``formats``, ``harmony``: chat formats (prompt renderer plus completion parser).
* ``template_format``: any open model's format, from ``model_tokenizer`` (its tokenizer),
  ``chat_template`` (its Jinja template, sandboxed, rendered incrementally) and
  ``tool_calls`` (its tool calls, parsed while streaming, each call's JSON read by
  ``call_scanner``).
* ``completion_parser``: sampled token ids back into items, for the project's chat format.
* ``timing``, ``prefix_cache``: the cost model and pacing, and the bounded prefix (KV)
  cache, which both simulated engines share.

The engines' settings (``SimConfig``, ``CompletionsConfig``, ``UpstreamConfig``) live beside
the server's configuration, in ``server/engine_config``.

``build_engine`` builds one by name. The engine modules are imported lazily, so importing
this package stays cheap (no tokenizer load).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tiktoken

    from ..core.ports import Engine
    from ..engine_config import CompletionsConfig, SimConfig, UpstreamConfig

__all__ = ["ENGINE_KINDS", "build_engine"]

#: The engine names ``build_engine`` accepts.
ENGINE_KINDS: tuple[str, ...] = ("sim", "script", "completions", "upstream")


def build_engine(
    kind: str,
    *,
    sim_config: SimConfig | None = None,
    script_path: str | os.PathLike[str] | None = None,
    encoding: tiktoken.Encoding | None = None,
    completions: CompletionsConfig | None = None,
    upstream: UpstreamConfig | None = None,
    open_compaction: Callable[[str], str] | None = None,
) -> Engine:
    """Build the engine named ``kind``.

    ``"sim"`` uses ``sim_config`` (default: the benchmark's headline point). ``"script"`` needs
    ``script_path`` and takes its timing and prefix-cache settings from ``sim_config``, so both
    engines pace identically. ``"completions"`` needs ``completions`` (its backend's settings)
    and ``"upstream"`` needs ``upstream`` (its upstream's). ``encoding`` defaults to
    ``core.rendering.tokenizer.load_encoding()``; ``open_compaction`` lets a completions route's
    renderer
    read compaction items.
    """
    from ..engine_config import SimConfig
    from .sim import SimEngine

    if kind == "completions":
        from ..core.ports import load_encoding
        from .completions import CompletionsEngine

        if completions is None:
            raise ValueError("the completions engine needs its backend settings (completions)")
        return CompletionsEngine(
            completions, encoding if encoding is not None else load_encoding(), open_compaction
        )
    if kind == "upstream":
        from .upstream import UpstreamResponsesEngine

        if upstream is None:
            raise ValueError("the upstream engine needs its upstream's settings (upstream)")
        return UpstreamResponsesEngine(upstream)
    config = sim_config if sim_config is not None else SimConfig()
    if kind == "sim":
        return SimEngine(config, encoding)
    if kind == "script":
        from .script import ScriptEngine

        if script_path is None:
            raise ValueError("the script engine needs script_path (a JSONL file of model turns)")
        return ScriptEngine(
            script_path,
            config.timing(),
            encoding,
            prefix_block_tokens=config.prefix_block_tokens,
            prefix_cache_max_blocks=config.prefix_cache_max_blocks,
        )
    raise ValueError(f"unknown engine {kind!r}; expected one of {', '.join(ENGINE_KINDS)}")
