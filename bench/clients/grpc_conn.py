"""Modes 6-10: the project's gRPC client, a Connect stream or one CreateResponse per turn."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from ..jsontypes import JSONObject
from ..wire import WireCounter
from .commands import SteerRound
from .exchange import BenchError, Exchange, wire_snapshot
from .steering import steer_round_grpc

if TYPE_CHECKING:
    from bidi_responses.client.aio import AsyncResponsesClient, ConnectStream

__all__ = ["GrpcConnectConn", "GrpcCreateConn"]


class GrpcConnectConn:
    """One Connect stream of our gRPC client."""

    def __init__(
        self, client: AsyncResponsesClient, wire: WireCounter | None, lane: str = ""
    ) -> None:
        self._client = client
        self._wire = wire
        self._stack = contextlib.AsyncExitStack()
        self._stream: ConnectStream | None = None
        #: The lane (``stream_id``) this connection's turns run on ("": the default lane).
        self._lane = lane

    async def open(self) -> GrpcConnectConn:
        """Open the stream."""
        self._stream = await self._stack.enter_async_context(self._client.connect())
        return self

    def lane(self, name: str) -> GrpcConnectConn:
        """Another agent's view of this stream: its turns on lane ``name``; closing the view
        leaves the stream to its owner."""
        view = GrpcConnectConn(self._client, self._wire, name)
        view._stream = self._open_stream
        return view

    @property
    def _open_stream(self) -> ConnectStream:
        if self._stream is None:
            raise BenchError("the Connect stream is not open (call open() first)")
        return self._stream

    async def _drain(self, events: AsyncGenerator[JSONObject, None], ex: Exchange) -> Exchange:
        stream = self._open_stream
        before = stream.messages_received
        async with contextlib.aclosing(events):
            async for event in events:
                if ex.observe(event):
                    ex.wire_after = wire_snapshot(self._wire)
                    ex.messages = stream.messages_received - before
                    return ex
        raise BenchError("the Connect stream ended before the response did")

    async def create(self, body: JSONObject) -> Exchange:
        """``response_create`` on the stream."""
        ex = Exchange(t_send=time.perf_counter())
        return await self._drain(self._open_stream.create_events(stream_id=self._lane, **body), ex)

    async def append(self, response_id: str, items: list[JSONObject]) -> Exchange:
        """``response_append`` on the stream."""
        ex = Exchange(t_send=time.perf_counter())
        events = self._open_stream.append_events(response_id, items, stream_id=self._lane)
        return await self._drain(events, ex)

    async def steer_round(self, body: JSONObject) -> SteerRound:
        """A create steered at its ``response.created``, followed to its successor's end."""
        return await steer_round_grpc(self._open_stream, body)

    async def aclose(self, abort: bool = False) -> None:
        """Half-close the stream and wait for its end; ``abort`` cancels the call first.

        A half-close lets in-flight responses finish, and an append-mode response that was
        left waiting for tool outputs would only finish at its append timeout.
        """
        if abort and self._stream is not None and not self._lane:
            self._stream.abort()  # a lane's view leaves the shared stream to its owner
        await self._stack.aclose()


class GrpcCreateConn:
    """The stateless CreateResponse call, one per turn, on a kept channel."""

    def __init__(self, client: AsyncResponsesClient, wire: WireCounter | None) -> None:
        self._client = client
        self._wire = wire

    async def create(self, body: JSONObject) -> Exchange:
        """One server-streaming call."""
        ex = Exchange(t_send=time.perf_counter())
        events = self._client.create_events(**body)
        async with contextlib.aclosing(events):
            async for event in events:
                if not ex.final and ex.observe(event):
                    ex.wire_after = wire_snapshot(self._wire)
                # After the terminal event, read on to the call's status, as a client should:
                # an abandoned call is cancelled (RST_STREAM) instead of ending cleanly.
        if not ex.final:
            raise BenchError("the CreateResponse call ended before the response did")
        return ex

    async def append(self, response_id: str, items: list[JSONObject]) -> Exchange:
        """CreateResponse has no append."""
        raise BenchError("append mode needs a Connect stream")

    async def aclose(self, abort: bool = False) -> None:
        """The channel is owned by whoever created it."""
