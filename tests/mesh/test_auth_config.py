"""Where API keys come from, and the loopback guard of an open server."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import httpx
import pytest
from bidi_responses.server.app import guard_public_bind
from bidi_responses.server.config import ServerConfig
from bidi_responses.server.core.tenancy.auth import ApiKeys, parse_keys_env

from tests.conftest import ServerFactory, make_config


def test_keys_from_file_environment_and_config(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("# key tenant\nsk-file tenant-f\n\n")
    keys = ApiKeys.load(
        {"sk-inline": "tenant-i"},
        str(keys_file),
        "MY_KEYS",
        environ={"MY_KEYS": "sk-env=tenant-e, sk-env2=tenant-e2"},
    )
    assert len(keys) == 4 and keys.enabled
    assert keys.authenticate("Bearer sk-file") == "tenant-f"
    assert keys.authenticate("bearer sk-env2") == "tenant-e2"
    assert keys.authenticate("Bearer sk-inline") == "tenant-i"
    for bad in (None, "", "Bearer", "Basic sk-file", "Bearer sk-nope"):
        with pytest.raises(Exception) as caught:
            keys.authenticate(bad)
        assert getattr(caught.value, "status", None) == 401
        assert "sk-" not in str(caught.value)  # the message never repeats a key
    assert ApiKeys({}).authenticate("Bearer anything") is None  # open server


def test_bad_key_sources_name_the_place_not_the_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="entry 2") as caught:
        parse_keys_env("sk-a=t, sk-secret-b")
    assert "sk-secret-b" not in str(caught.value)
    keys_file = tmp_path / "keys"
    keys_file.write_text("sk-secret-c\n")
    with pytest.raises(ValueError, match=":1:") as caught:
        ApiKeys.load({}, str(keys_file), environ={})
    assert "sk-secret-c" not in str(caught.value)


def test_open_server_binds_loopback_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BIDI_RESPONSES_API_KEYS", raising=False)
    config, said = guard_public_bind(ServerConfig(host="0.0.0.0"))
    assert config.host == "127.0.0.1" and "loopback only" in said
    allowed = ServerConfig(host="0.0.0.0")
    allowed.auth.allow_unauthenticated_public = True
    config, said = guard_public_bind(allowed)
    assert config.host == "0.0.0.0" and "open to anyone" in said
    keyed = ServerConfig(host="0.0.0.0")
    keyed.auth.api_keys = {"k": "t"}
    assert guard_public_bind(dataclasses.replace(keyed)) == (keyed, "")
    monkeypatch.setenv("BIDI_RESPONSES_API_KEYS", "k=t")
    config, said = guard_public_bind(ServerConfig(host="0.0.0.0"))
    assert config.host == "0.0.0.0" and said == ""


def test_a_keys_source_that_holds_no_key_leaves_the_bind_on_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty keys file (a platform's secret not filled in) or an empty variable configures
    no key: the server is open, so it binds loopback, as with no source at all."""
    monkeypatch.delenv("BIDI_RESPONSES_API_KEYS", raising=False)
    empty = tmp_path / "keys"
    empty.write_text("# no keys yet\n\n")
    from_file = ServerConfig(host="0.0.0.0")
    from_file.auth.api_keys_file = str(empty)
    config, said = guard_public_bind(from_file)
    assert config.host == "127.0.0.1" and "loopback only" in said
    monkeypatch.setenv("BIDI_RESPONSES_API_KEYS", " , ")
    config, said = guard_public_bind(ServerConfig(host="0.0.0.0"))
    assert config.host == "127.0.0.1" and "loopback only" in said


async def test_keys_from_the_environment_reach_every_transport(
    server_factory: ServerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BIDI_RESPONSES_API_KEYS", "sk-env=tenant-e")
    running = await server_factory(make_config(tmp_path), http=True)
    async with (
        asyncio.timeout(20),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{running.http_port}") as http,
    ):
        body = {"model": "sim-model", "input": "x"}
        assert (await http.post("/v1/responses", json=body)).status_code == 401
        ok = await http.post("/v1/responses", json=body, headers={"authorization": "Bearer sk-env"})
        assert ok.status_code == 200


def test_tls_needs_both_certificate_and_key(capsys: pytest.CaptureFixture[str]) -> None:
    from bidi_responses.server.cli import main

    assert main(["serve", "--tls-cert", "server.pem"]) == 2
    assert "--tls-key" in capsys.readouterr().err
