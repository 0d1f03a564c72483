"""One address floods a ``serve`` process running under RLIMIT_NOFILE 512 with idle
connections: the server never runs out of descriptors, another address is served on every
transport meanwhile, and the log stays a few lines long (it was 1.78 million lines in 40 s
before connections were bounded: docs/mesh.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.faults.descriptor_flood import (
    close_all,
    flood,
    open_descriptors,
    other_client,
    serve,
)

NOFILE = 512


async def test_an_http_flood_from_one_address_leaves_the_others_served(tmp_path: Path) -> None:
    async with asyncio.timeout(100), serve(tmp_path, NOFILE, {}) as server:
        held = await flood(server.http_port, 700)
        try:
            during = await other_client(server)
            assert during.http and during.websocket and during.grpc, during.failures
            assert open_descriptors(server.process.pid) < NOFILE - 100
        finally:
            close_all(held)
        after = await other_client(server)
        assert after.http and after.websocket and after.grpc, after.failures
    lines = server.log_lines()
    assert len(lines) < 60, lines[-20:]
    assert not any("ERROR" in line or "Traceback" in line for line in lines), lines


async def test_accept_out_of_descriptors_sheds_without_spinning_or_flooding_the_log(
    tmp_path: Path,
) -> None:
    """A configured limit above what the descriptors allow: accept() does run out. Connections
    past it are refused at once (a 503 when the client can read it), the log says so a few
    times, not once per try, and once the flood ends the server serves again."""
    limits = {"max_connections": 100_000, "max_connections_per_peer": 0}
    async with asyncio.timeout(100), serve(tmp_path, NOFILE, limits) as server:
        held = await flood(server.http_port, 700)
        close_all(held)
        after = await other_client(server)
        assert after.http and after.websocket and after.grpc, after.failures
    lines = server.log_lines()
    shed = [line for line in lines if "out of descriptors" in line]
    assert 1 <= len(shed) <= 11, lines[-20:]
    assert len(lines) < 60, lines[-20:]
    assert not any("accept() out of system resource" in line for line in lines)


async def test_a_grpc_flood_is_held_to_the_grpc_share(tmp_path: Path) -> None:
    """grpc core closes connections past its share at accept(): descriptors stay free for
    the HTTP listener, which serves another address; gRPC serves again once the flood ends.
    (grpc core cannot tell addresses apart before accepting: see docs/mesh.md.)"""
    async with asyncio.timeout(100), serve(tmp_path, NOFILE, {}) as server:
        held = await flood(server.grpc_port, 700)
        try:
            during = await other_client(server)
            assert during.http and during.websocket, during.failures
            assert open_descriptors(server.process.pid) < NOFILE - 100
        finally:
            close_all(held)
        after = await other_client(server)
        assert after.http and after.websocket and after.grpc, after.failures
    assert len(server.log_lines()) < 60
