"""Helpers of the Connect tests: a stream on its own channel, a create left in flight."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from bidi_responses.client import AsyncResponsesClient, ConnectStream, Response
from bidi_responses.codec import params_to_pb
from bidi_responses.server.app import RunningServer
from bidi_responses.v1 import responses_pb2 as pb

from tests.conftest import SHELL_TOOL


@contextlib.asynccontextmanager
async def open_stream(running: RunningServer) -> AsyncIterator[ConnectStream]:
    """A Connect stream to ``running`` on a channel of its own (both closed after)."""
    async with (
        AsyncResponsesClient(f"127.0.0.1:{running.grpc_port}") as client,
        client.connect() as stream,
    ):
        yield stream


async def start_create(
    stream: ConnectStream, text: str
) -> tuple[AsyncIterator[dict[str, Any]], dict[str, Any]]:
    """Send a create without waiting for its end: the stream's events and its
    ``response.created``."""
    await stream.send(
        pb.ConnectRequest(response_create=params_to_pb({"model": "sim-model", "input": text}))
    )
    events = stream.events()
    return events, await anext(events)


async def pause_for_tool_outputs(stream: ConnectStream) -> Response:
    """An append-mode response that has called the shell tool and waits for its output."""
    return await stream.create(model="sim-model", input="go", tools=[SHELL_TOOL], append_mode=True)
