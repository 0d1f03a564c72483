"""``make faults``: the hostile runs of connections and compressed messages, at full size.

- A descriptor flood at the common soft limit (RLIMIT_NOFILE 1,024): 3,000 idle connections
  from one address, with the default limits and with a configured limit above what the
  descriptors allow. Another address must be served (defaults: during the flood too), and
  the log must stay short.
- 16 WebSocket connections with compression on, each sending a 63 MiB message that is about
  64 KB on the wire: the server's peak RSS must grow by no more than the request budget
  allows (256 MiB at 4 copies a byte), plus headroom, where it once grew by 1.8 GB.

Smaller versions run in ``make test``: ``tests/hostile/test_descriptor_flood.py`` and
``tests/hostile/test_compressed_limits.py``.
"""

from __future__ import annotations

import asyncio
import zlib
from pathlib import Path

import pytest
import websockets
from websockets.extensions.permessage_deflate import ClientPerMessageDeflateFactory

from tests.faults.descriptor_flood import (
    close_all,
    flood,
    open_descriptors,
    other_client,
    serve,
)

MIB = 1024 * 1024


def _memory(pid: int) -> tuple[int, int]:
    """VmRSS and VmHWM (peak) of ``pid``, in bytes."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "limits",
    [{}, {"max_connections": 100_000, "max_connections_per_peer": 0}],
    ids=["defaults", "past-the-descriptors"],
)
async def test_descriptor_flood_at_the_common_soft_limit(
    tmp_path: Path, limits: dict[str, int | bool]
) -> None:
    async with asyncio.timeout(300), serve(tmp_path, 1024, limits) as server:
        held = await flood(server.http_port, 3000)
        during = await other_client(server)
        fds = open_descriptors(server.process.pid)
        close_all(held)
        after = await other_client(server)
    lines = server.log_lines()
    print(
        f"\nFAULTS descriptor flood ({'defaults' if not limits else 'limit past descriptors'}): "
        f"3000 connections from one address, RLIMIT_NOFILE 1024: server descriptors {fds}; "
        f"another address served during: http {during.http}, websocket {during.websocket}, "
        f"grpc {during.grpc}; after: http {after.http}, websocket {after.websocket}, grpc "
        f"{after.grpc}; log {len(lines)} lines"
    )
    assert after.http and after.websocket and after.grpc, after.failures
    assert len(lines) < 100, lines[-20:]
    if not limits:
        assert during.http and during.websocket and during.grpc, during.failures
        assert fds < 1024 - 100


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.timeout(600)
async def test_16_compressed_63_mib_messages_stay_within_the_budget(tmp_path: Path) -> None:
    body = b'{"type":"response.create","model":"sim-model","store":false,"input":"' + (
        b"a" * (63 * MIB)
    )
    body += b'"}'
    outcomes: list[str] = []
    async with (
        asyncio.timeout(300),
        serve(tmp_path, 16384, {"websocket_compression": True}) as server,
    ):
        pid = server.process.pid
        await other_client(server)  # warm: every transport has served once
        rss_before, _ = _memory(pid)

        async def one() -> None:
            deflate = ClientPerMessageDeflateFactory()
            try:
                async with websockets.connect(
                    f"ws://127.0.0.1:{server.http_port}/v1/responses",
                    extensions=[deflate],
                    compression=None,
                    max_size=None,
                ) as ws:
                    await ws.send(body.decode())
                    while True:
                        frame = await ws.recv()
                        if '"response.completed"' in frame or '"type":"error"' in frame:
                            outcomes.append("answered")
                            return
            except websockets.ConnectionClosed as closed:
                code = closed.rcvd.code if closed.rcvd is not None else None
                outcomes.append(f"close {code}")

        await asyncio.gather(*(one() for _ in range(16)))
        _, peak = _memory(pid)
        after = await other_client(server)
    wire = len(zlib.compress(body, 6))
    growth = peak - rss_before
    print(
        f"\nFAULTS compressed WebSocket: 16 x 63 MiB messages ({wire / 1024:.0f} KB each on "
        f"the wire), compression on: outcomes {sorted(outcomes)}; server peak RSS "
        f"+{growth / MIB:.0f} MiB over {rss_before / MIB:.0f} MiB"
    )
    assert len(outcomes) == 16
    assert after.http and after.websocket and after.grpc, after.failures
    # The budget (256 MiB) bounds what is held of messages; engines, parsing and the
    # allocator's slack come on top.
    assert growth < 450 * MIB, growth
