"""The async client: it opens Connect streams (``stream.ConnectStream``, for agent loops) and
makes the stateless and unary calls.

Parameters and events are JSON-shaped dicts, exactly as in the Responses API documentation;
protobuf stays inside. A typical agent turn::

    async with AsyncResponsesClient("127.0.0.1:50051") as client:
        async with client.connect() as stream:
            first = await stream.create(model="sim-model", input="fix the bug", tools=tools)
            nxt = await stream.create(model="sim-model", previous_response_id=first.id,
                                      input=[{"type": "function_call_output", ...}], tools=tools)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from types import TracebackType
from typing import TypeVar

import grpc
from bidi_responses.codec import (
    EventDecoder,
    canonical_item,
    checked_item_to_dict,
    deep_messages,
    flat_message_to_dict,
    item_to_pb,
    params_to_pb,
    unbatch,
    usage_to_dict,
)
from bidi_responses.codec.aio_wakeups import drain_completion_wakeups
from bidi_responses.schema import InputItemList
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc

from .channel import (
    CHANNEL_OPTIONS,
    DEFAULT_DELTA_WINDOW_MS,
    ConnectCall,
    accept_deep_replies,
    delivery_options,
    status_error,
)
from .outcome import collect_response
from .stream import ConnectStream
from .types import JSONObject, JSONValue, Response

# ConnectCall and ConnectStream are re-exported: callers import them from here.
__all__ = ["AsyncResponsesClient", "ConnectCall", "ConnectStream"]

Request = TypeVar("Request")
Reply = TypeVar("Reply")


class AsyncResponsesClient:
    """An async client for ``bidi_responses.v1.ResponsesService``."""

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        api_key: str | None = None,
        channel: grpc.aio.Channel | None = None,
        batch_events: bool = True,
        snapshots: str = "full",
        json_tool_schemas: bool = True,
        delta_window_ms: int = DEFAULT_DELTA_WINDOW_MS,
    ) -> None:
        """``api_key`` is sent as ``authorization: Bearer ...``; the server accounts usage to
        a tenant derived from it (as over HTTP).

        ``batch_events`` asks the server to send the events that are ready together in one
        message (fewer messages, less CPU on both sides); iteration still yields one event at
        a time. ``snapshots="slim"`` asks for snapshot events without the echoed instructions
        and tools (``Response.raw`` then has ``instructions`` None and ``tools`` empty).
        ``json_tool_schemas`` (on by default) sends function schemas as JSON text and asks
        for them so in the echoes (``FunctionTool.parameters_json``): the schema's keys reach
        the model in the caller's order (a Struct keeps none: its keys arrive sorted), it is
        cheaper than Structs on both sides, and it carries schemas nested past protobuf's
        depth limit. Turn it off only for a server that does not know the field (older ones
        ignore it and see no schema). ``delta_window_ms`` is the delta
        window asked for on Connect streams: 20 ms by default (fewer, larger deltas; an item's
        first delta and its end are never delayed); 0 keeps the server's (2 ms by default).
        """
        self._json_parameters = json_tool_schemas
        self._delivery = delivery_options(
            batch_events=batch_events,
            snapshots=snapshots,
            json_tool_schemas=json_tool_schemas,
            delta_window_ms=delta_window_ms,
        )
        self._channel = channel or grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.ResponsesServiceStub(self._channel)
        accept_deep_replies(self._stub, self._channel)
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key else None

    async def __aenter__(self) -> AsyncResponsesClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close()

    def open_stream(self) -> ConnectStream:
        """Open a Connect stream that the caller closes (``connect()`` does it for you)."""
        call = self._stub.Connect(metadata=self._metadata)
        _drain_wakeups()
        return ConnectStream(call, self._delivery)

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[ConnectStream]:
        """Open a Connect stream.

        On a normal exit the stream is half-closed and drained (in-flight responses finish);
        when the block raises (a timeout, a cancellation) it is aborted at once, which makes
        the server cancel in-flight work.
        """
        stream = self.open_stream()
        try:
            await stream.established()
            yield stream
        except BaseException:
            stream.abort()
            raise
        await stream.close()

    async def create_events(self, **params: JSONValue) -> AsyncGenerator[JSONObject, None]:
        """Stateless create: the events of one response."""
        decoder = EventDecoder()
        with deep_messages():
            request = pb.CreateResponseRequest(delivery=self._delivery)
            params_to_pb(params, json_parameters=self._json_parameters, into=request.params)
        call = self._stub.CreateResponse(request, metadata=self._metadata)
        _drain_wakeups()
        try:
            async for message in call:
                for event in unbatch(message.event):
                    yield decoder.event(event)
        except grpc.aio.AioRpcError as error:
            raise status_error(error) from None
        finally:
            # Stopping early ends the call (a background response runs on regardless).
            call.cancel()

    async def create(self, **params: JSONValue) -> Response:
        """Stateless create; waits for the terminal event."""
        return await collect_response(self.create_events(**params))

    async def _unary(
        self, method: grpc.aio.UnaryUnaryMultiCallable[Request, Reply], request: Request
    ) -> Reply:
        call = method(request, metadata=self._metadata)
        _drain_wakeups()
        try:
            return await call
        except grpc.aio.AioRpcError as error:
            raise status_error(error) from None

    async def get(self, response_id: str) -> Response:
        """A stored response."""
        reply = await self._unary(
            self._stub.GetResponse, pb.GetResponseRequest(response_id=response_id)
        )
        return Response.from_dict(EventDecoder().response(reply.response))

    async def delete(self, response_id: str) -> bool:
        """Delete a stored response."""
        reply = await self._unary(
            self._stub.DeleteResponse, pb.DeleteResponseRequest(response_id=response_id)
        )
        return bool(reply.deleted)

    async def list_input_items(
        self, response_id: str, *, limit: int = 20, order: str = "desc", after: str = ""
    ) -> InputItemList:
        """One page of a stored response's input items (OpenAI list shape)."""
        reply = await self._unary(
            self._stub.ListInputItems,
            pb.ListInputItemsRequest(
                response_id=response_id, limit=limit, order=order, after=after
            ),
        )
        return {
            "object": "list",
            "data": [checked_item_to_dict(i) for i in reply.data],
            "first_id": reply.first_id or None,
            "last_id": reply.last_id or None,
            "has_more": reply.has_more,
        }

    async def cancel(self, response_id: str) -> Response:
        """Cancel an in-flight response by id."""
        reply = await self._unary(
            self._stub.CancelResponse, pb.CancelResponseRequest(response_id=response_id)
        )
        return Response.from_dict(EventDecoder().response(reply.response))

    async def stream_response(
        self, response_id: str, *, starting_after: int | None = None
    ) -> AsyncGenerator[JSONObject, None]:
        """The events of a background response after ``starting_after`` (all if None),
        then live to its end: how a dropped ``create_events(background=True)`` resumes."""
        request = pb.StreamResponseRequest(response_id=response_id)
        if starting_after is not None:
            request.starting_after = starting_after
        decoder = EventDecoder()
        call = self._stub.StreamResponse(request, metadata=self._metadata)
        _drain_wakeups()
        try:
            async for message in call:
                yield decoder.event(message.event)
        except grpc.aio.AioRpcError as error:
            raise status_error(error) from None
        finally:
            call.cancel()

    async def compact(self, **params: JSONValue) -> JSONObject:
        """Compact a conversation (``model``, ``input``, ``instructions``,
        ``previous_response_id``); returns the JSON ``response.compaction`` object."""
        raw_input = params.get("input")
        if isinstance(raw_input, str):
            raw_input = [{"type": "message", "role": "user", "content": raw_input}]
        request = pb.CompactResponseRequest(
            model=params.get("model") or "",
            input=[item_to_pb(canonical_item(i)) for i in raw_input or ()],
        )
        for name in ("instructions", "previous_response_id"):
            if params.get(name) is not None:
                setattr(request, name, params[name])
        reply = await self._unary(self._stub.CompactResponse, request)
        return {
            "id": reply.id,
            "object": reply.object,
            "created_at": reply.created_at,
            "output": [checked_item_to_dict(i) for i in reply.output],
            "usage": usage_to_dict(reply.usage),
        }

    async def count_input_tokens(self, **params: JSONValue) -> int:
        """The prompt tokens a create with ``params`` would use."""
        reply = await self._unary(
            self._stub.CountInputTokens,
            pb.CountInputTokensRequest(
                params=params_to_pb(params, json_parameters=self._json_parameters)
            ),
        )
        return int(reply.input_tokens)

    async def list_models(self) -> list[JSONObject]:
        """The configured models (``id``, ``object``, ``created``, ``owned_by``)."""
        reply = await self._unary(self._stub.ListModels, pb.ListModelsRequest())
        return [flat_message_to_dict(m) for m in reply.data]

    async def get_model(self, model: str) -> JSONObject:
        """One configured model; ResponsesError ``model_not_found`` if unknown."""
        reply = await self._unary(self._stub.GetModel, pb.GetModelRequest(model=model))
        return flat_message_to_dict(reply.model)

    async def stats(self) -> JSONObject:
        """The server's cumulative counters."""
        reply = await self._unary(self._stub.GetStats, pb.GetStatsRequest())
        return flat_message_to_dict(reply)


def _drain_wakeups() -> None:
    """grpc.aio's completion wake-ups drained on this loop, as the server drains its own: with
    many streams on a busy loop they pile up and stall every call (``codec.aio_wakeups``)."""
    with contextlib.suppress(RuntimeError):  # no running loop: grpc.aio is not in use yet
        drain_completion_wakeups()
