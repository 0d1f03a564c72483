"""Start-up failures, server faults and log lines, as an operator sees them."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from bidi_responses.client import AsyncResponsesClient, ResponsesError

from tests.conftest import ServerFactory, make_config
from tests.pipeline.server_process import serve_process
from tests.ws.conftest import connector, error_of

REPO = Path(__file__).resolve().parents[2]


def _serve(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "bidi_responses.server.cli",
            "serve",
            "--grpc-port",
            "0",
            "--http-port",
            "0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def _one_line_error(result: subprocess.CompletedProcess[str], needle: str) -> None:
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
    assert "Traceback" not in result.stderr


def test_an_unusable_data_dir_stops_serve_with_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    _one_line_error(_serve("--data-dir", str(blocker / "data")), "data directory")


def test_engine_errors_stop_serve_at_start_up(tmp_path: Path) -> None:
    config = tmp_path / "server.toml"
    config.write_text('[models.m]\nengine = "script"\nscript_path = "missing.jsonl"\n')
    result = _serve("--config", str(config), "--data-dir", str(tmp_path / "d"))
    _one_line_error(result, "model 'm'")
    assert str(tmp_path / "missing.jsonl") in result.stderr


async def test_a_relative_script_path_is_relative_to_the_config_file(tmp_path: Path) -> None:
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    shutil.copy(REPO / "examples" / "codex-shell-once.jsonl", conf_dir / "turns.jsonl")
    config = conf_dir / "server.toml"
    config.write_text('[models.sim-model]\nengine = "script"\nscript_path = "turns.jsonl"\n')
    async with (
        asyncio.timeout(60),
        serve_process(tmp_path / "data", args=("--config", str(config))) as (_, port, _log),
        AsyncResponsesClient(f"127.0.0.1:{port}") as client,
    ):
        response = await client.create(model="sim-model", input="say hi")
        assert response.status == "completed"


async def test_client_strings_cannot_forge_log_lines(tmp_path: Path) -> None:
    config = tmp_path / "server.toml"
    stage = "examples.custom_stage:KeywordClassifier"
    config.write_text(
        f'stages = ["validation", "{stage}"]\n'
        f'[stage_settings."{stage}"]\nwords = ["forbidden"]\nblock = true\n'
    )
    forged = "2026-01-01 00:00:00,000 ERROR bidi_responses: forged"
    async with (
        asyncio.timeout(60),
        serve_process(tmp_path / "data", args=("--config", str(config))) as (_, port, log),
        AsyncResponsesClient(f"127.0.0.1:{port}") as client,
    ):
        with pytest.raises(ResponsesError):
            await client.create(model="sim-model", input="forbidden", user=f"bob\n{forged}")
        line = await log.wait_for("blocked a request")
    assert "bob\\n2026-01-01" in line
    assert not any(entry.startswith(forged) for entry in str(log).splitlines())


class Boom:
    """A pipeline stage with a bug."""

    name = "boom"

    async def examine(self, batch: object, carried: object) -> list[object]:
        raise RuntimeError("internal detail 9f3a")


async def test_a_server_fault_is_a_logged_500_without_exception_text(
    server_factory: ServerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    config = make_config(tmp_path)
    config.stages = [*config.stages, f"{__file__}:Boom"]
    server = await server_factory(config, http=True)
    async with asyncio.timeout(30):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http:
            reply = await http.post("/v1/responses", json={"model": "sim-model", "input": "x"})
        assert reply.status_code == 500
        assert reply.json()["error"]["code"] == "server_error"
        async with connector(server.http_port)() as sock:
            error = error_of(await sock.create(model="sim-model", input="x"))
            assert error["code"] == "server_error"
        async with AsyncResponsesClient(f"127.0.0.1:{server.grpc_port}") as client:
            with pytest.raises(ResponsesError) as caught:
                await client.create(model="sim-model", input="x")
            assert caught.value.code == "server_error"
    assert "9f3a" not in reply.text and "9f3a" not in str(error) and "9f3a" not in str(caught.value)
    faults = [r for r in caplog.records if r.exc_info and "9f3a" in str(r.exc_info[1])]
    assert len(faults) == 3
