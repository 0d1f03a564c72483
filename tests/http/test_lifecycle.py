"""The HTTP server's lifecycle on uvicorn: it starts, serves and stops, and never takes the
application's signals."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from bidi_responses.server.app import RunningServer
from bidi_responses.server.assembly import HTTP_NAMING, build_core, transport_port
from bidi_responses.server.transports.http import start_http_server

from tests.conftest import ServerFactory, make_config
from tests.http.conftest import http_client

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _handlers() -> dict[int, Callable[..., Any] | int | None]:
    return {sig: signal.getsignal(sig) for sig in SIGNALS}


async def test_the_http_server_leaves_signals_to_the_application(
    server_factory: ServerFactory,
) -> None:
    # uvicorn's Server.serve would swap in its own SIGTERM/SIGINT handlers while serving and
    # put the old ones back at its end, in the middle of the application's graceful stop.
    before = _handlers()
    running: RunningServer = await server_factory(http=True)
    async with asyncio.timeout(20):
        async with http_client(running) as http:
            assert (await http.get("/readyz")).json() == {"status": "ok"}
        assert _handlers() == before
        await running.stop(grace=1)
        assert _handlers() == before


async def test_stop_closes_the_listener(server_factory: ServerFactory) -> None:
    running: RunningServer = await server_factory(http=True)
    async with asyncio.timeout(20):
        async with http_client(running) as http:
            assert (await http.get("/healthz")).status_code == 200
        await running.stop(grace=1)
        async with http_client(running) as http:
            with pytest.raises(httpx.ConnectError):
                await http.get("/healthz")


async def test_a_start_up_failure_is_raised_by_start(tmp_path: Path) -> None:
    # uvicorn loads the certificate inside its serving task: start must report the failure,
    # not return a port that nothing serves.
    config = make_config(tmp_path)
    config.tls.cert_file = str(tmp_path / "missing-cert.pem")
    config.tls.key_file = str(tmp_path / "missing-key.pem")
    core = build_core(config)
    try:
        async with asyncio.timeout(20):
            with pytest.raises(FileNotFoundError):
                await start_http_server(transport_port(core, HTTP_NAMING), config, "127.0.0.1", 0)
    finally:
        await core.close()
