"""Inference engines: the interface (``base``) and the simulated engines behind it.

* ``base``: the ``Engine`` protocol and its request/event types.
* ``sim``: ``SimEngine``, a deterministic simulated model (tool calls, then an answer).
* ``script``: ``ScriptEngine``, which replays model turns from a JSONL file.
* ``timing``: the cost model, pacing and prefix (KV) cache both simulated engines share.

``build_engine`` builds one by name. The engine modules are imported lazily, so importing
``engines.base`` stays cheap (no tokenizer load).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tiktoken
    from bidi_responses.server.engines.base import Engine
    from bidi_responses.server.engines.sim import SimConfig

__all__ = ["ENGINE_KINDS", "build_engine"]

#: The engine names ``build_engine`` accepts.
ENGINE_KINDS: tuple[str, ...] = ("sim", "script")


def build_engine(
    kind: str,
    *,
    sim_config: SimConfig | None = None,
    script_path: str | os.PathLike[str] | None = None,
    encoding: tiktoken.Encoding | None = None,
) -> Engine:
    """Build the engine named ``kind``.

    ``"sim"`` uses ``sim_config`` (default: the benchmark's headline point). ``"script"`` needs
    ``script_path`` and takes its timing and prefix-cache settings from ``sim_config``, so both
    engines pace identically. ``encoding`` defaults to ``core.tokenizer.load_encoding()``.
    """
    from bidi_responses.server.engines.sim import SimConfig, SimEngine

    config = sim_config if sim_config is not None else SimConfig()
    if kind == "sim":
        return SimEngine(config, encoding)
    if kind == "script":
        from bidi_responses.server.engines.script import ScriptEngine

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
