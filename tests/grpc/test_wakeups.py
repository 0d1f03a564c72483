"""grpc.aio's completion wake-ups are drained (``codec/aio_wakeups.py``).

grpc.aio writes a byte per completion and its reader reads one per turn of the loop; the
server and the project's client wrap that reader so a turn reads all the waiting bytes. The
completions here are real: Connect streams from blocking stubs in a thread (grpc's synchronous
API, which does not use the event loop's wake-ups), whose messages reach the server while its
loop is held; and a client's calls to a server in another process.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import Iterator
from typing import Any

import grpc
from bidi_responses.client import AsyncResponsesClient
from bidi_responses.codec.aio_wakeups import (
    completion_reader,
    drain_completion_wakeups,
    pending_bytes,
)
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc

from tests.conftest import ServerFactory
from tests.pipeline.server_process import serve_process

STREAMS = 16


class _Streams:
    """``STREAMS`` Connect streams on one blocking channel, each fed from its own queue."""

    def __init__(self, port: int) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = pb_grpc.ResponsesServiceStub(self.channel)
        self.feeds: list[queue.Queue[pb.ConnectRequest | None]] = []
        self.calls: list[Any] = []
        for _ in range(STREAMS):
            feed: queue.Queue[pb.ConnectRequest | None] = queue.Queue()
            self.feeds.append(feed)
            self.calls.append(stub.Connect(_drain(feed), timeout=60))

    def opened(self) -> None:
        """Block until every stream has the server's headers (sent before it reads)."""
        for call in self.calls:
            call.initial_metadata()

    def send_one_each(self) -> None:
        for feed in self.feeds:
            feed.put(pb.ConnectRequest())

    def close(self) -> None:
        for feed in self.feeds:
            feed.put(None)
        for call in self.calls:
            call.cancel()
        self.channel.close()


def _drain(feed: queue.Queue[pb.ConnectRequest | None]) -> Iterator[pb.ConnectRequest]:
    while (message := feed.get()) is not None:
        yield message


def _hold_loop_until(condition: Any, timeout_s: float) -> None:
    """Keep the event loop from turning until ``condition()`` holds (completions then queue up
    in grpc, as they do behind a busy loop); AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "no completions arrived"


async def test_the_server_drains_the_wakeups_of_a_busy_loop(
    server_factory: ServerFactory,
) -> None:
    async with asyncio.timeout(60):
        running = await server_factory()
        reader = completion_reader(asyncio.get_running_loop())
        assert reader is not None  # installed when the gRPC listener started
        assert drain_completion_wakeups()  # and only once
        assert completion_reader(asyncio.get_running_loop()) is reader

        streams = _Streams(running.grpc_port)
        try:
            await asyncio.to_thread(streams.opened)
            # Every stream waits for a message; the loop is held while they all arrive, so
            # their read completions queue up behind it, a wake-up byte each.
            before = reader.drained_bytes
            streams.send_one_each()
            _hold_loop_until(lambda: pending_bytes(reader.fd) >= 2, timeout_s=20)
            waiting = pending_bytes(reader.fd)
            # The next turn of the loop reads all of them but grpc's own one (grpc alone would
            # read one per turn, and the rest would pile up).
            # (Polled: the reader is grpc's socket's, with no event of its own to wait on.)
            while reader.drained_bytes - before < waiting - 1:  # noqa: ASYNC110
                await asyncio.sleep(0)
            assert reader.drained_bytes - before >= waiting - 1
            # What /metrics shows operators: the same count.
            scraped = running.core.metrics.scrape().decode()
            assert f"bidi_grpc_wakeups_drained_total {float(reader.drained_bytes)}" in scraped
        finally:
            streams.close()


async def test_the_project_client_drains_the_wakeups_of_its_own_loop(tmp_path: Any) -> None:
    # The server runs in another process: every completion on this loop is the client's.
    async with asyncio.timeout(60), serve_process(tmp_path / "data") as (_, port, _log):
        loop = asyncio.get_running_loop()
        async with AsyncResponsesClient(f"127.0.0.1:{port}") as client:
            assert await client.list_models()
            reader = completion_reader(loop)
            assert reader is not None
            async with client.connect() as stream:
                await stream.create(model="sim-model", input="hi")
            assert completion_reader(loop) is reader  # installed once
