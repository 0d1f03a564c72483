"""The benchmark's agents on lanes of one connection: WebSocket mode's demultiplexer and
Connect's lane views, against a real server. Every agent's turns must end with its own
response, the lanes' events never crossing over, on one connection per mode."""

from __future__ import annotations

import asyncio

from bidi_responses.bench.clients.grpc_conn import GrpcConnectConn
from bidi_responses.bench.clients.ws_lanes import WsLanes
from bidi_responses.bench.jsontypes import JSONObject
from bidi_responses.client import AsyncResponsesClient
from bidi_responses.server.app import RunningServer

LANES = 4


def _body(index: int) -> JSONObject:
    return {"model": "sim-model", "store": False, "input": f"Lane {index}: say hi."}


async def test_websocket_lanes_share_one_connection(http_server: RunningServer) -> None:
    async with asyncio.timeout(60):
        lanes = await WsLanes.open(f"http://127.0.0.1:{http_server.http_port}")
        try:
            views = [lanes.lane(f"agent-{i}") for i in range(LANES)]
            exchanges = await asyncio.gather(*(v.create(_body(i)) for i, v in enumerate(views)))
            # Twice on each lane: a lane runs its turns in order, on the same socket.
            again = await asyncio.gather(*(v.create(_body(i)) for i, v in enumerate(views)))
        finally:
            await lanes.aclose()
    for index, ex in enumerate([*exchanges, *again]):
        assert ex.final["type"] == "response.completed", ex.final
        assert ex.final["stream_id"] == f"agent-{index % LANES}"
    ids = {ex.final["response"]["id"] for ex in [*exchanges, *again]}
    assert len(ids) == 2 * LANES


async def test_connect_lanes_share_one_stream(server: RunningServer) -> None:
    async with asyncio.timeout(60), AsyncResponsesClient(f"127.0.0.1:{server.grpc_port}") as c:
        owner = await GrpcConnectConn(c, None).open()
        try:
            views = [owner.lane(f"agent-{i}") for i in range(LANES)]
            exchanges = await asyncio.gather(*(v.create(_body(i)) for i, v in enumerate(views)))
            for view in views:
                await view.aclose(abort=True)  # a view never ends the owner's stream
            again = await views[0].create(_body(0))
        finally:
            await owner.aclose()
    for ex in [*exchanges, again]:
        assert ex.final["type"] == "response.completed", ex.final
    assert len({ex.final["response"]["id"] for ex in [*exchanges, again]}) == LANES + 1
