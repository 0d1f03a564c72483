"""Routes to real backends load from TOML and build their engines; bad settings say why."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from bidi_responses.server.config import load_config
from bidi_responses.server.core.rendering.tokenizer import load_encoding
from bidi_responses.server.engine_config import CompletionsConfig, UpstreamConfig
from bidi_responses.server.engines import build_engine
from bidi_responses.server.engines.completions import CompletionsEngine
from bidi_responses.server.engines.upstream import UpstreamResponsesEngine

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


async def test_the_command_line_reaches_every_setting_of_an_open_model(tmp_path: Path) -> None:
    from bidi_responses.server.cli import config_from_args

    from tests.engines.model_files import CHATML, write_model_dir

    files = write_model_dir(tmp_path / "model", "llama3")
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML, encoding="utf-8")
    flags = [
        "--data-dir", str(tmp_path / "data"), "--engine", "completions",
        "--backend-url", "http://127.0.0.1:9/v1", "--backend-format", "template",
        "--backend-tokenizer", str(files), "--backend-chat-template", str(template),
        "--backend-tool-call-format", "tags",
    ]  # fmt: skip
    route = config_from_args(flags).models["sim-model"]
    settings = route.completions
    assert (settings.format, settings.tokenizer) == ("template", str(files))
    assert (settings.chat_template, settings.tool_call_format) == (str(template), "tags")
    engine = build_engine(route.engine, encoding=load_encoding(), completions=settings)
    assert isinstance(engine, CompletionsEngine)
    # The model's vocabulary, with the template from the flag (not the model's Llama 3 one).
    assert engine.renderer.format_name.startswith("template:tokenizer.json:")
    vocabulary = engine.format.vocabulary
    assert vocabulary is not None
    assert engine.format.assistant_start == tuple(vocabulary.encode_text("<|im_start|>assistant\n"))
    await engine.aclose()
