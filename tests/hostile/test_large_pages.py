"""Stored responses with large input items, listed by a stock gRPC client (4 MiB per message):
pages fit the client's limit, every item is reached by paging, and a reply the client refuses
anyway (one item over its limit) is no ERROR line on the server."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest
from bidi_responses.client import AsyncResponsesClient
from bidi_responses.server.app import RunningServer
from bidi_responses.server.transports.grpc.servicer import PAGE_BYTES
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)

STOCK_CLIENT_LIMIT = 4 * 1024 * 1024


async def _stored(server: RunningServer, items: list[dict[str, object]]) -> str:
    async with (
        AsyncResponsesClient(f"127.0.0.1:{server.grpc_port}") as client,
        client.connect() as stream,
    ):
        response = await stream.create(model="sim-model", input=items, store=True)
    return response.id


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_default_page_of_large_items_fits_a_stock_client(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    # 20 items of 300 KB: the default page of 20 would be 6 MB.
    items: list[dict[str, object]] = [
        {"type": "message", "role": "user", "content": f"{n:02d}" + "z" * 300_000}
        for n in range(20)
    ]
    async with asyncio.timeout(40):
        response_id = await _stored(server, items)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = pb_grpc.ResponsesServiceStub(channel)
            seen: list[str] = []
            after = ""
            pages = 0
            while True:
                page = await stub.ListInputItems(
                    pb.ListInputItemsRequest(response_id=response_id, order="asc", after=after)
                )
                pages += 1
                assert page.ByteSize() <= PAGE_BYTES + 64 * 1024 < STOCK_CLIENT_LIMIT
                seen += [item.message.content[0].input_text.text[:2] for item in page.data]
                if not page.has_more:
                    break
                after = page.last_id
    assert seen == [f"{n:02d}" for n in range(20)]  # every item, in order, once
    assert pages > 1
    assert _errors(caplog) == []


async def test_a_reply_the_client_refuses_logs_no_error(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    big = [{"type": "message", "role": "user", "content": "z" * 6_000_000}]
    async with asyncio.timeout(40):
        response_id = await _stored(server, big)  # type: ignore[arg-type]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = pb_grpc.ResponsesServiceStub(channel)
            for _ in range(10):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.ListInputItems(pb.ListInputItemsRequest(response_id=response_id))
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # The server is fine: a small call still works on the same channel.
            stats = await stub.GetStats(pb.GetStatsRequest())
            assert isinstance(stats, pb.GetStatsResponse)
    assert _errors(caplog) == []
