"""A large steer is checked off the event loop, and its refusal fits a stock client.

A refused steer echoes its input (``response.steer.failed``), so that the client can send it
elsewhere. A multi-megabyte echo cost the writer a second of encoding on the event loop, and a
stock grpcio client refuses any message over 4 MiB, which ended the whole stream over one
refused steer. Past ``ECHO_MAX_CHARS`` the echo is empty; the stream goes on.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from bidi_responses.codec import item_to_dict, params_to_pb, steer_to_pb
from bidi_responses.schema import JSONValue
from bidi_responses.server.config import Limits
from bidi_responses.server.core.lanes.control_events import ECHO_MAX_CHARS
from bidi_responses.server.core.tenancy.caller import ANONYMOUS
from bidi_responses.server.transports.streams import Incoming, Refusal, StreamDriver, open_stream
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc

from tests.conftest import ServerFactory
from tests.core.fake_engine import Turn, started_core
from tests.core.session_events import create
from tests.transports.test_stream_driver import MemoryWire, port_of

pytestmark = pytest.mark.timeout(60)

STOCK_CLIENT_LIMIT = 4 * 1024 * 1024


@pytest.mark.parametrize("shape", ["string", "messages"])
async def test_a_refused_multi_megabyte_steer_leaves_the_stream_usable(
    server_factory: ServerFactory, shape: str
) -> None:
    running = await server_factory()
    text = "x" * (STOCK_CLIENT_LIMIT + 1024)
    steering: object = (
        text if shape == "string" else [{"type": "message", "role": "user", "content": text}]
    )
    requests: asyncio.Queue[pb.ConnectRequest | None] = asyncio.Queue()
    requests.put_nowait(pb.ConnectRequest(response_steer=steer_to_pb("resp_unknown", steering)))

    async def sent() -> AsyncIterator[pb.ConnectRequest]:
        while (request := await requests.get()) is not None:
            yield request

    async with (
        asyncio.timeout(30),
        grpc.aio.insecure_channel(
            f"127.0.0.1:{running.grpc_port}",
            # The stock client's limit, as every generated stub has it by default.
            options=[("grpc.max_receive_message_length", STOCK_CLIENT_LIMIT)],
        ) as channel,
    ):
        call = pb_grpc.ResponsesServiceStub(channel).Connect(sent())
        failed = await call.read()
        assert isinstance(failed, pb.ConnectResponse)
        assert failed.WhichOneof("event") == "response_steer_failed"
        assert failed.response_steer_failed.error.code == "response_not_found"
        assert failed.ByteSize() < ECHO_MAX_CHARS  # echoed empty
        # The stream goes on: a turn completes on it.
        requests.put_nowait(
            pb.ConnectRequest(response_create=params_to_pb({"model": "sim-model", "input": "hi"}))
        )
        kinds = []
        while (message := await call.read()) is not grpc.aio.EOF:
            assert isinstance(message, pb.ConnectResponse)
            kinds.append(message.WhichOneof("event"))
            if kinds[-1] == "response_completed":
                break
        assert kinds[-1] == "response_completed"
        requests.put_nowait(None)
        assert await call.code() == grpc.StatusCode.OK


async def test_a_small_refused_steer_is_echoed_as_sent(server_factory: ServerFactory) -> None:
    running = await server_factory()
    steering = [{"type": "message", "role": "user", "content": "use tabs"}]
    async with (
        asyncio.timeout(30),
        grpc.aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel,
    ):
        request = pb.ConnectRequest(response_steer=steer_to_pb("resp_unknown", steering))
        call = pb_grpc.ResponsesServiceStub(channel).Connect(iter([request]))
        replies = [reply async for reply in call]
    assert len(replies) == 1
    echoed = replies[0].response_steer_failed.steer
    assert echoed.previous_response_id == "resp_unknown"
    assert [item_to_dict(item) for item in echoed.input] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "use tabs"}]}
    ]


class RecordingWire(MemoryWire):
    """A memory wire that notes which thread decoded each message, by its size."""

    def __init__(self, limits: Limits) -> None:
        super().__init__(limits, half_close=True)
        self.decoded_on: dict[int, str] = {}

    def decode(self, message: JSONValue) -> Incoming | Refusal | None:
        self.decoded_on[self.size(message)] = threading.current_thread().name
        return super().decode(message)


async def test_a_large_message_is_decoded_in_a_worker_thread(tmp_path: Path) -> None:
    async with started_core(tmp_path) as (engine, core), asyncio.timeout(20):
        engine.turns.append(Turn())
        core.config.limits.offload_chars = 10_000
        session = open_stream(port_of(core), ANONYMOUS)
        wire = RecordingWire(core.config.limits)
        running = asyncio.get_running_loop().create_task(
            StreamDriver(port_of(core), session, wire).run()
        )
        small = create(input="hi")
        large = {"type": "response.steer", "previous_response_id": "resp_x", "input": "y" * 20_000}
        await wire.inbox.put(small)
        await wire.until("response.completed")
        await wire.inbox.put(large)
        await wire.until("response.steer.failed")
        await wire.inbox.put(None)
        await running
    main = threading.main_thread().name
    small_size, large_size = sorted(wire.decoded_on)
    assert wire.decoded_on[small_size] == main
    assert wire.decoded_on[large_size] != main
