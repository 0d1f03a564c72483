"""Routes to real backends load from TOML and build their engines; bad settings say why."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from bidi_responses.server.config import load_config
from bidi_responses.server.core.rendering.tokenizer import load_encoding
from bidi_responses.server.engines import build_engine
from bidi_responses.server.engines.completions import CompletionsConfig, CompletionsEngine
from bidi_responses.server.engines.upstream import UpstreamConfig, UpstreamResponsesEngine

EXAMPLE = Path(__file__).parents[2] / "examples" / "real-backends.toml"


async def test_the_example_config_builds_every_engine() -> None:
    config = load_config(EXAMPLE)
    encoding = load_encoding()
    built = {
        alias: build_engine(
            route.engine,
            encoding=encoding,
            completions=route.completions,
            upstream=route.upstream,
        )
        for alias, route in config.models.items()
    }
    gpt_oss = built["gpt-oss"]
    assert isinstance(gpt_oss, CompletionsEngine)
    assert gpt_oss.renderer.format_name == "harmony"
    assert gpt_oss.config.extra_body == {"top_k": 40}
    assert isinstance(built["llama"], CompletionsEngine)
    assert built["llama"].renderer.format_name == "generic"
    assert isinstance(built["relay"], UpstreamResponsesEngine)
    for engine in built.values():
        await engine.aclose()  # type: ignore[attr-defined]


def test_bad_settings_name_the_setting() -> None:
    encoding = load_encoding()
    with pytest.raises(ValueError, match="unknown format 'chatml'"):
        CompletionsEngine(dataclasses.replace(CompletionsConfig(), format="chatml"), encoding)
    with pytest.raises(ValueError, match="context_window"):
        CompletionsEngine(CompletionsConfig(context_window=0), encoding)
    with pytest.raises(ValueError, match="unknown transport 'grpc'"):
        UpstreamResponsesEngine(UpstreamConfig(transport="grpc"))
