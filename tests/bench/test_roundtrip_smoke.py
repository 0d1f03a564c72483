"""The round-trip benchmark, small: each transport's event is answered by the session with
its error event, and every round is timed. Correctness only; the latencies are the
benchmark's (``make roundtrip``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from bidi_responses.bench.clients import ServerAddress
from bidi_responses.bench.roundtrip import TRANSPORTS, measure

from tests.conftest import ServerFactory, make_config

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_every_round_is_answered_and_timed(
    server_factory: ServerFactory, tmp_path: Path, transport: str
) -> None:
    running = await server_factory(make_config(tmp_path), http=True)
    assert running.http_port is not None
    address = ServerAddress("127.0.0.1", running.grpc_port, running.http_port)
    async with asyncio.timeout(30):
        times = await measure(address, transport, 20, 3000)
        # After a pause, as an agent's stream is while its tool runs: still answered.
        rested = await measure(address, transport, 3, 10, idle_ms=20)
    assert len(times) == 20 and all(t > 0 for t in times)
    assert len(rested) == 3 and all(t > 0 for t in rested)


async def test_an_unknown_transport_is_refused() -> None:
    address = ServerAddress("127.0.0.1", 1, 1)
    with pytest.raises(ValueError, match="carrier_pigeon"):
        await measure(address, "carrier_pigeon", 1, 1)
