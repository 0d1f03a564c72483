"""`serve --engine`: every engine is reachable from the command line, with its settings."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from bidi_responses.client import AsyncResponsesClient
from bidi_responses.server.app import RunningServer
from bidi_responses.server.cli import config_from_args, main
from bidi_responses.server.config import RouteConfig
from bidi_responses.server.core.rendering.tokenizer import load_encoding
from bidi_responses.server.engines import ENGINE_KINDS, build_engine
from bidi_responses.server.engines.completions import CompletionsEngine
from bidi_responses.server.engines.script import ScriptEngine
from bidi_responses.server.engines.sim import SimEngine
from bidi_responses.server.engines.upstream import UpstreamResponsesEngine

from tests.conftest import ServerFactory, ledger_by_id
from tests.pipeline.server_process import serve_process

SCRIPT = Path(__file__).parents[2] / "examples" / "codex-shell-once.jsonl"
BACKEND = "http://127.0.0.1:9/v1"  # loopback; nothing is sent while a config is built

# Per engine: the flags a user passes, and the engine class they must build.
COMPLETIONS_FLAGS = [
    "--engine", "completions", "--backend-url", BACKEND, "--backend-model", "tiny",
    "--backend-api-key-env", "TINY_KEY", "--backend-format", "harmony",
    "--route-setting", "completions.context_window=8192",
]  # fmt: skip
UPSTREAM_FLAGS = [
    "--engine", "upstream", "--backend-url", BACKEND, "--backend-model", "gpt-x",
    "--upstream-transport", "http", "--route-setting", "upstream.store=true",
]  # fmt: skip
ENGINE_FLAGS: dict[str, tuple[list[str], type]] = {
    "sim": (
        ["--engine", "sim", "--sim-tps", "500", "--sim-prefill-tps", "2e6", "--sim-seed", "7"],
        SimEngine,
    ),
    "script": (["--engine", "script", "--script", str(SCRIPT)], ScriptEngine),
    "completions": (COMPLETIONS_FLAGS, CompletionsEngine),
    "upstream": (UPSTREAM_FLAGS, UpstreamResponsesEngine),
}


def _route(*args: str) -> RouteConfig:
    return config_from_args(["--data-dir", "unused", *args]).models["sim-model"]


def test_every_engine_has_flags() -> None:
    assert set(ENGINE_FLAGS) == set(ENGINE_KINDS)


@pytest.mark.parametrize("kind", ENGINE_KINDS)
async def test_the_flags_build_the_engine(kind: str) -> None:
    flags, engine_class = ENGINE_FLAGS[kind]
    route = _route(*flags)
    assert route.engine == kind
    engine = build_engine(
        route.engine,
        sim_config=route.sim,
        script_path=route.script_path,
        encoding=load_encoding(),
        completions=route.completions,
        upstream=route.upstream,
    )
    assert isinstance(engine, engine_class)
    if isinstance(engine, CompletionsEngine):
        assert engine.config.base_url == BACKEND and engine.config.model == "tiny"
        assert engine.config.api_key_env == "TINY_KEY"
        assert engine.config.context_window == 8192
        assert engine.renderer.format_name == "harmony"
        await engine.aclose()
    elif isinstance(engine, UpstreamResponsesEngine):
        assert engine.config.base_url == BACKEND and engine.config.model == "gpt-x"
        assert engine.config.transport == "http" and engine.config.store is True
        await engine.aclose()
    elif kind == "sim":
        assert route.sim.tokens_per_second == 500 and route.sim.seed == 7
        assert route.sim.prefill_tokens_per_second == 2e6
    else:
        assert route.script_path == str(SCRIPT)


def test_route_settings_take_toml_values() -> None:
    route = _route(
        "--engine", "completions",
        "--route-setting", "completions.extra_body={top_k = 40, stop = ['<|end|>']}",
        "--route-setting", "completions.max_retries=0",
        "--route-setting", "completions.model=plain-word",
    )  # fmt: skip
    assert route.completions.extra_body == {"top_k": 40, "stop": ["<|end|>"]}
    assert route.completions.max_retries == 0
    assert route.completions.model == "plain-word"
    # The engine itself is a setting too: one line selects it.
    assert _route("--route-setting", "engine=upstream").engine == "upstream"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend-url", BACKEND], "--backend-url does not apply to --engine sim"),
        (["--engine", "completions", "--upstream-transport", "http"], "--upstream-transport"),
        (["--route-setting", "completions.window=1"], "unknown setting 'window'"),
        (["--route-setting", "no-equals-sign"], "expected KEY=VALUE"),
        (["--route-setting", "engine=llama"], "unknown engine 'llama'"),
        (["--engine", "script"], "--engine script needs --script"),
    ],
)
def test_bad_engine_flags_say_why(args: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _route(*args)


async def test_serve_relays_to_an_upstream_given_by_flags(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    upstream: RunningServer = await server_factory(http=True)
    flags = [
        "--engine", "upstream", "--backend-url", f"http://127.0.0.1:{upstream.http_port}/v1",
        "--backend-model", "sim-model", "--model", "relay",
    ]  # fmt: skip
    async with (
        serve_process(tmp_path / "relay", args=flags) as (_, port, _log),
        AsyncResponsesClient(f"127.0.0.1:{port}") as client,
        client.connect() as stream,
    ):
        response = await stream.create(model="relay", input="hello")
    assert response.status == "completed", response
    await upstream.stop(grace=0)
    # The turn ran on the upstream server, under the model the flags named.
    rows = list((await ledger_by_id(upstream)).values())
    assert [row.model for row in rows] == ["sim-model"]


@pytest.mark.parametrize(
    ("absent", "args", "extra"),
    [
        ("asyncpg", ["--store-url", "postgresql://u@127.0.0.1:9/db"], "postgres"),
        ("opentelemetry", ["--otel-tracing"], "otel"),
        (
            "tokenizers",
            [
                "--engine",
                "completions",
                "--backend-url",
                "http://127.0.0.1:9/v1",
                "--route-setting",
                "completions.tokenizer='model/tokenizer.json'",
            ],
            "models",
        ),
    ],
)
def test_a_choice_without_its_extra_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, absent: str, args: list[str], extra: str
) -> None:
    monkeypatch.setitem(sys.modules, absent, None)  # as if the package were not installed
    with pytest.raises(ValueError, match=rf"needs the '{extra}' extra: pip install"):
        config_from_args(args)


def test_compare_without_the_bench_extra_names_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    with pytest.raises(SystemExit) as exited:
        main(["compare", "--smoke"])
    assert exited.value.code == 2
    assert "compare needs the 'bench' extra" in capsys.readouterr().err


def test_usage_of_a_shared_store_without_its_extra_names_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "asyncpg", None)
    assert main(["usage", "--store-url", "postgresql://u@127.0.0.1:9/db"]) == 2
    assert "'postgres' extra" in capsys.readouterr().err
