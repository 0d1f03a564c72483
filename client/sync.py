"""A blocking wrapper around the async client, for scripts and notebooks.

The async client runs on a private event loop in a background thread; each method submits a
coroutine there and waits for it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping, Sequence
from types import TracebackType
from typing import Literal, TypeVar

from bidi_responses.schema import InputItemList

from .agent import AgentResult, ToolFunction, run_agent_loop
from .aio import AsyncResponsesClient
from .channel import DEFAULT_DELTA_WINDOW_MS
from .stream import ConnectStream
from .types import (
    JSONMapping,
    JSONObject,
    JSONValue,
    Response,
    ResponseInput,
    SteerAck,
)

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="bidi-responses-client", daemon=True
        )
        self.thread.start()

    def run(self, coro: Coroutine[object, object, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class SyncConnectStream:
    """Blocking view of a Connect stream."""

    def __init__(self, loop: _LoopThread, stream: ConnectStream) -> None:
        self._loop = loop
        self._stream = stream

    def create(self, *, stream_id: str = "", **params: JSONValue) -> Response:
        """See ConnectStream.create."""
        return self._loop.run(self._stream.create(stream_id=stream_id, **params))

    def append(
        self, response_id: str, input: Sequence[JSONMapping], *, stream_id: str = ""
    ) -> Response:
        """See ConnectStream.append."""
        return self._loop.run(self._stream.append(response_id, input, stream_id=stream_id))

    def steer(self, *, previous_response_id: str, input: ResponseInput) -> SteerAck:
        """See ConnectStream.steer (callable from another thread while a create waits)."""
        return self._loop.run(
            self._stream.steer(previous_response_id=previous_response_id, input=input)
        )

    def follow(self, previous_response_id: str) -> Response:
        """See ConnectStream.follow."""
        return self._loop.run(self._stream.follow(previous_response_id))

    def run_agent_loop(
        self,
        *,
        model: str,
        input: ResponseInput,
        tools: Sequence[JSONObject],
        functions: Mapping[str, ToolFunction],
        mode: Literal["chain", "append"] = "chain",
        **params: JSONValue,
    ) -> AgentResult:
        """See bidi_responses.client.agent.run_agent_loop (tool functions run on the loop)."""
        return self._loop.run(
            run_agent_loop(
                self._stream,
                model=model,
                input=input,
                tools=tools,
                functions=functions,
                mode=mode,
                **params,
            )
        )

    def close(self) -> None:
        """Half-close the stream and wait for it to end."""
        self._loop.run(self._stream.close())


class ResponsesClient:
    """Blocking client for ``bidi_responses.v1.ResponsesService``."""

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        api_key: str | None = None,
        batch_events: bool = True,
        snapshots: str = "full",
        json_tool_schemas: bool = True,
        delta_window_ms: int = DEFAULT_DELTA_WINDOW_MS,
    ) -> None:
        """See ``AsyncResponsesClient`` for ``batch_events``, ``snapshots``,
        ``json_tool_schemas`` and ``delta_window_ms``."""
        self._loop = _LoopThread()

        async def make() -> AsyncResponsesClient:
            return AsyncResponsesClient(
                target,
                api_key=api_key,
                batch_events=batch_events,
                snapshots=snapshots,
                json_tool_schemas=json_tool_schemas,
                delta_window_ms=delta_window_ms,
            )

        self._client = self._loop.run(make())

    def __enter__(self) -> ResponsesClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def connect(self) -> SyncConnectStream:
        """Open a Connect stream (close it with ``close()``)."""

        async def open_stream() -> ConnectStream:
            return self._client.open_stream()

        return SyncConnectStream(self._loop, self._loop.run(open_stream()))

    def create(self, **params: JSONValue) -> Response:
        """Stateless create."""
        return self._loop.run(self._client.create(**params))

    def get(self, response_id: str) -> Response:
        """A stored response."""
        return self._loop.run(self._client.get(response_id))

    def delete(self, response_id: str) -> bool:
        """Delete a stored response."""
        return self._loop.run(self._client.delete(response_id))

    def list_input_items(
        self, response_id: str, *, limit: int = 20, order: str = "desc", after: str = ""
    ) -> InputItemList:
        """A page of input items."""
        return self._loop.run(
            self._client.list_input_items(response_id, limit=limit, order=order, after=after)
        )

    def compact(self, **params: JSONValue) -> JSONObject:
        """Compact a conversation (the ``response.compaction`` object)."""
        return self._loop.run(self._client.compact(**params))

    def count_input_tokens(self, **params: JSONValue) -> int:
        """The prompt tokens a create with ``params`` would use."""
        return self._loop.run(self._client.count_input_tokens(**params))

    def list_models(self) -> list[JSONObject]:
        """The configured models."""
        return self._loop.run(self._client.list_models())

    def stats(self) -> JSONObject:
        """Server counters."""
        return self._loop.run(self._client.stats())

    def close(self) -> None:
        """Close the channel and stop the background loop."""
        self._loop.run(self._client.close())
        self._loop.stop()
