"""A client decides how often it sends something undecodable: the server's log of it is
rate-limited per kind, and what is left out is counted (in the next line and on /metrics)."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from bidi_responses.server.app import RunningServer
from bidi_responses.server.core.observability.ratelimit import CLIENT_FAULTS, LogLimiter

from tests.conftest import until
from tests.hostile.test_grpc_decode import _raw_connect


async def test_undecodable_grpc_messages_log_a_bounded_number_of_lines(
    http_server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bidi_responses")
    suppressed_before = CLIENT_FAULTS.suppressed.get("grpc-undecodable", 0)
    async with asyncio.timeout(60):
        events = await _raw_connect(http_server, [b"\xff\xff\xff\xff"] * 200)
    assert sum(event["type"] == "error" for event in events) == 200  # each still answered
    lines = [r for r in caplog.records if "undecodable" in r.getMessage()]
    assert 1 <= len(lines) <= CLIENT_FAULTS.per_minute, len(lines)
    left_out = CLIENT_FAULTS.suppressed["grpc-undecodable"] - suppressed_before
    assert left_out == 200 - len(lines)
    async with httpx.AsyncClient(timeout=10) as http:
        metrics = (await http.get(f"http://127.0.0.1:{http_server.http_port}/metrics")).text
    assert 'bidi_log_lines_suppressed_total{kind="grpc-undecodable"}' in metrics


def test_the_limiter_writes_its_allowance_then_says_what_it_left_out() -> None:
    now = [0.0]
    limiter = LogLimiter(3, clock=lambda: now[0])
    assert [limiter.allow("a") for _ in range(5)] == [0, 0, 0, None, None]
    assert limiter.allow("b") == 0  # kinds are counted apart
    now[0] = 61.0
    assert limiter.allow("a") == 2  # the next window's first line reports the two left out
    assert limiter.allow("a") == 0
    assert limiter.suppressed == {"a": 2}
    assert LogLimiter(0).allow("a") == 0  # 0: no limit


def test_the_log_line_carries_the_count(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    limiter = LogLimiter(1, clock=lambda: now[0])
    log = logging.getLogger("bidi_responses.test_log_rate")
    with caplog.at_level(logging.WARNING, logger=log.name):
        for _ in range(4):
            limiter.log(log, logging.WARNING, "k", "refused %s", "x")
        now[0] = 60.0
        limiter.log(log, logging.WARNING, "k", "refused %s", "y")
    assert [r.getMessage() for r in caplog.records] == [
        "refused x",
        "refused y (3 more like this left out)",
    ]


async def test_garbage_and_abandoned_bodies_log_no_error_and_a_bounded_number_of_lines(
    http_server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    """60 connections that send garbage, and 20 that announce a body and close after one
    byte of it: no ERROR (a client leaving is not a server fault), at most the allowance of
    "Invalid HTTP request" lines, and the server still answers."""
    caplog.set_level(logging.INFO)
    port = http_server.http_port
    assert port is not None

    async def garbage() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"\x16\x03\x01 not http at all\r\n\r\n")
        await reader.read()  # the server answers 400 and closes
        writer.close()

    async def abandoned() -> None:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{")
        await writer.drain()
        writer.close()

    async with asyncio.timeout(60):
        await asyncio.gather(*(garbage() for _ in range(60)))
        await asyncio.gather(*(abandoned() for _ in range(20)))
        async with httpx.AsyncClient(timeout=10) as http:
            reply = await http.post(
                f"http://127.0.0.1:{port}/v1/responses",
                json={"model": "sim-model", "input": "hi", "store": False},
            )
            assert reply.status_code == 200
        # Every abandoned request has been read to its end by the server.
        await until(lambda: http_server.core.request_bytes.held == 0)
    invalid = [r for r in caplog.records if "Invalid HTTP request" in r.getMessage()]
    assert 1 <= len(invalid) <= CLIENT_FAULTS.per_minute, len(invalid)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
