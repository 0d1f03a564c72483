"""The async client: a Connect stream for agent loops, and the unary calls.

Parameters and events are JSON-shaped dicts, exactly as in the Responses API documentation;
protobuf stays inside. A typical agent turn::

    async with AsyncResponsesClient("127.0.0.1:50051") as client:
        async with client.connect() as stream:
            first = await stream.create(model="sim-model", input="fix the bug", tools=tools)
            nxt = await stream.create(model="sim-model", previous_response_id=first.id,
                                      input=[{"type": "function_call_output", ...}], tools=tools)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc
from bidi_responses.client.types import TERMINAL_EVENTS, Response, ResponsesError
from bidi_responses.codec import (
    EventDecoder,
    canonical_item,
    decode_message,
    deep_messages,
    flat_message_to_dict,
    item_to_dict,
    item_to_pb,
    params_to_pb,
    unbatch,
    usage_to_dict,
)
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc

_MAX_MESSAGE = 64 * 1024 * 1024
_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
    ("grpc.max_send_message_length", _MAX_MESSAGE),
)


_SNAPSHOT_DETAIL = {"full": pb.SNAPSHOT_DETAIL_FULL, "slim": pb.SNAPSHOT_DETAIL_SLIM}


def delivery_options(*, batch_events: bool, snapshots: str) -> pb.DeliveryOptions:
    """The ``DeliveryOptions`` this client asks for (``snapshots``: "full" or "slim")."""
    if snapshots not in _SNAPSHOT_DETAIL:
        raise ValueError(f"snapshots must be 'full' or 'slim', not {snapshots!r}")
    return pb.DeliveryOptions(
        batch_events=batch_events, snapshot_detail=_SNAPSHOT_DETAIL[snapshots]
    )


def _status_error(error: grpc.aio.AioRpcError) -> ResponsesError:
    metadata = dict(error.trailing_metadata() or ())
    code = metadata.get("error-code")
    return ResponsesError(
        str(code) if code else error.code().name.lower(),
        error.details() or "",
        str(metadata.get("error-param") or "") or None,
    )


# One Connect call on the typed stub (mypy-protobuf).
ConnectCall = grpc.aio.StreamStreamCall[pb.ConnectRequest, pb.ConnectResponse]
Request = TypeVar("Request")
Reply = TypeVar("Reply")


class ConnectStream:
    """One Connect stream: a connection-scoped cache on the server, several lanes on it.

    Each lane (``stream_id``) runs one response at a time; use one lane per agent to run
    agents in parallel over one stream.
    """

    def __init__(self, call: ConnectCall, delivery: pb.DeliveryOptions | None = None) -> None:
        self._call = call
        # Sent with the first message: how the server should deliver this stream's events.
        self._delivery = delivery
        self._decoder = EventDecoder()
        # Raw messages per lane: they are decoded only when someone asks for events, so
        # ``create()`` pays for the terminal event alone.
        self._lanes: dict[str, asyncio.Queue[pb.ConnectResponse | None]] = {}
        self._busy: set[str] = set()
        # grpc.aio allows one write at a time per call; lanes share the call.
        self._write_lock = asyncio.Lock()
        self._reader = asyncio.get_running_loop().create_task(self._read())
        self.warnings: list[dict[str, Any]] = []
        #: gRPC messages received so far (a batch is one message carrying several events).
        self.messages_received = 0

    async def established(self) -> None:
        """Wait until the server has accepted the stream (its initial metadata arrived), so
        the call's set-up is not paid inside the first turn."""
        try:
            await self._call.initial_metadata()
        except grpc.aio.AioRpcError as error:
            raise _status_error(error) from None

    def _queue(self, lane: str) -> asyncio.Queue[pb.ConnectResponse | None]:
        queue = self._lanes.get(lane)
        if queue is None:
            queue = self._lanes[lane] = asyncio.Queue()
            if self._reader.done():
                queue.put_nowait(None)  # the stream already ended: nothing will arrive
        return queue

    async def _read(self) -> None:
        try:
            async for received in self._call:
                self.messages_received += 1
                # A batch is several events in one message; each is handled on its own.
                for message in unbatch(received):
                    if message.WhichOneof("event") == "warning":
                        self.warnings.append(self._decoder.event(message))
                        continue
                    self._queue(message.stream_id).put_nowait(message)
        except grpc.aio.AioRpcError as error:
            closing = _status_error(error)
            for lane, queue in self._lanes.items():
                queue.put_nowait(
                    pb.ConnectResponse(
                        stream_id=lane,
                        error=pb.ErrorEvent(
                            error=pb.ErrorDetail(
                                type="stream_error",
                                code=closing.code or "",
                                message=closing.message,
                            )
                        ),
                    )
                )
        finally:
            for queue in self._lanes.values():
                queue.put_nowait(None)

    async def send(self, request: pb.ConnectRequest) -> None:
        """Send a raw ConnectRequest (for clients that build messages themselves)."""
        async with self._write_lock:
            if self._delivery is not None and request.WhichOneof("event") is not None:
                request.delivery.CopyFrom(self._delivery)
                self._delivery = None
            try:
                await self._call.write(request)
            except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as error:
                raise ResponsesError(
                    "stream_closed", f"the stream has ended; open a new one ({error!r})"
                ) from None

    async def events(self, stream_id: str = "") -> AsyncIterator[dict[str, Any]]:
        """Every event that arrives on a lane, until the stream ends."""
        queue = self._queue(stream_id)
        while True:
            message = await queue.get()
            if message is None:
                return
            yield self._decoder.event(message)

    async def create_events(
        self, *, stream_id: str = "", **params: Any
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Send ``response.create`` and yield its events up to the terminal (or error) one.

        In append mode the iteration also stops at ``response.done``; answer it with
        ``append_events``.
        """
        if stream_id in self._busy:
            raise RuntimeError(f"lane '{stream_id}' already has a response in flight")
        self._busy.add(stream_id)
        try:
            async for message in self._create_messages(stream_id, params):
                yield self._decoder.event(message)
        finally:
            self._busy.discard(stream_id)

    async def _create_messages(
        self, stream_id: str, params: dict[str, Any]
    ) -> AsyncIterator[pb.ConnectResponse]:
        self._queue(stream_id)  # before sending: the end of the stream must reach this lane
        with deep_messages():  # tool schemas may nest past protobuf's default depth
            request = pb.ConnectRequest(stream_id=stream_id, response_create=params_to_pb(params))
        await self.send(request)
        async for message in self._until_turn_ends(stream_id):
            yield message

    async def _until_turn_ends(self, stream_id: str) -> AsyncIterator[pb.ConnectResponse]:
        queue = self._queue(stream_id)
        while True:
            message = await queue.get()
            if message is None:
                raise ResponsesError("stream_closed", "the stream ended before the response did")
            yield message
            if message.WhichOneof("event") in _TURN_END_CASES:
                return

    async def create(self, *, stream_id: str = "", **params: Any) -> Response:
        """Create a response and wait for it; raises ResponsesError on an error event."""
        if stream_id in self._busy:
            raise RuntimeError(f"lane '{stream_id}' already has a response in flight")
        self._busy.add(stream_id)
        try:
            return await self._collect(self._create_messages(stream_id, params))
        finally:
            self._busy.discard(stream_id)

    async def append_events(
        self, response_id: str, input: Sequence[dict[str, Any]], *, stream_id: str = ""
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Send ``response.append`` (tool outputs) and yield events until the next pause/end."""
        with deep_messages():
            request = pb.ConnectRequest(
                stream_id=stream_id,
                response_append=pb.ResponseAppend(
                    response_id=response_id, input=[item_to_pb(i) for i in input]
                ),
            )
        await self.send(request)
        async for message in self._until_turn_ends(stream_id):
            yield self._decoder.event(message)

    async def append(
        self, response_id: str, input: Sequence[dict[str, Any]], *, stream_id: str = ""
    ) -> Response:
        """Append tool outputs and wait for the next ``response.done`` or the terminal event."""
        with deep_messages():
            request = pb.ConnectRequest(
                stream_id=stream_id,
                response_append=pb.ResponseAppend(
                    response_id=response_id, input=[item_to_pb(i) for i in input]
                ),
            )
        await self.send(request)
        return await self._collect(self._until_turn_ends(stream_id))

    async def _collect(self, messages: AsyncIterator[pb.ConnectResponse]) -> Response:
        """The turn's outcome, decoding only the message that ends it."""
        async for message in messages:
            if message.WhichOneof("event") in _TURN_END_CASES:
                return _outcome(self._decoder.event(message))
        raise ResponsesError("stream_closed", "the stream ended before the response did")

    async def cancel(self, response_id: str = "", *, stream_id: str = "") -> None:
        """Ask the server to stop the lane's in-flight response."""
        await self.send(
            pb.ConnectRequest(
                stream_id=stream_id, response_cancel=pb.ResponseCancel(response_id=response_id)
            )
        )

    async def close(self) -> None:
        """Half-close and wait for the server to end the stream."""
        with contextlib.suppress(grpc.aio.UsageError, grpc.aio.AioRpcError):
            async with self._write_lock:
                await self._call.done_writing()
        await asyncio.gather(self._reader, return_exceptions=True)

    def abort(self) -> None:
        """Drop the stream at once (the server cancels in-flight work)."""
        self._call.cancel()
        self._reader.cancel()


_TURN_END_CASES = frozenset(
    {"response_completed", "response_failed", "response_incomplete", "response_done", "error"}
)


def _outcome(event: dict[str, Any]) -> Response:
    """The Response of a turn-ending event; ResponsesError for an error event."""
    kind = event["type"]
    if kind == "error":
        raise ResponsesError.from_event(event)
    if kind == "response.done":
        return Response.from_dict(event["response"], event.get("pending_calls") or [])
    return Response.from_dict(event["response"])


async def _collect(events: AsyncGenerator[dict[str, Any], None]) -> Response:
    async with contextlib.aclosing(events):
        async for event in events:
            kind = event["type"]
            if kind in TERMINAL_EVENTS or kind in ("error", "response.done"):
                return _outcome(event)
    raise ResponsesError("stream_closed", "the stream ended before the response did")


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
    ) -> None:
        """``api_key`` is sent as ``authorization: Bearer ...``; the server accounts usage to
        a tenant derived from it (as over HTTP).

        ``batch_events`` asks the server to send the events that are ready together in one
        message (fewer messages, less CPU on both sides); iteration still yields one event at
        a time. ``snapshots="slim"`` asks for snapshot events without the echoed instructions
        and tools (``Response.raw`` then has ``instructions`` None and ``tools`` empty).
        """
        self._delivery = delivery_options(batch_events=batch_events, snapshots=snapshots)
        self._channel = channel or grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
        self._stub = pb_grpc.ResponsesServiceStub(self._channel)
        _accept_deep_replies(self._stub, self._channel)
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
        return ConnectStream(self._stub.Connect(metadata=self._metadata), self._delivery)

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

    async def create_events(self, **params: Any) -> AsyncGenerator[dict[str, Any], None]:
        """Stateless create: the events of one response."""
        decoder = EventDecoder()
        with deep_messages():
            request = pb.CreateResponseRequest(params=params_to_pb(params), delivery=self._delivery)
        call = self._stub.CreateResponse(request, metadata=self._metadata)
        try:
            async for message in call:
                for event in unbatch(message.event):
                    yield decoder.event(event)
        except grpc.aio.AioRpcError as error:
            raise _status_error(error) from None
        finally:
            # Stopping early ends the call (a background response runs on regardless).
            call.cancel()

    async def create(self, **params: Any) -> Response:
        """Stateless create; waits for the terminal event."""
        return await _collect(self.create_events(**params))

    async def _unary(
        self, method: grpc.aio.UnaryUnaryMultiCallable[Request, Reply], request: Request
    ) -> Reply:
        try:
            return await method(request, metadata=self._metadata)
        except grpc.aio.AioRpcError as error:
            raise _status_error(error) from None

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
    ) -> dict[str, Any]:
        """One page of a stored response's input items (OpenAI list shape)."""
        reply = await self._unary(
            self._stub.ListInputItems,
            pb.ListInputItemsRequest(
                response_id=response_id, limit=limit, order=order, after=after
            ),
        )
        return {
            "object": "list",
            "data": [item_to_dict(i) for i in reply.data],
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
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The events of a background response after ``starting_after`` (all if None),
        then live to its end: how a dropped ``create_events(background=True)`` resumes."""
        request = pb.StreamResponseRequest(response_id=response_id)
        if starting_after is not None:
            request.starting_after = starting_after
        decoder = EventDecoder()
        call = self._stub.StreamResponse(request, metadata=self._metadata)
        try:
            async for message in call:
                yield decoder.event(message.event)
        except grpc.aio.AioRpcError as error:
            raise _status_error(error) from None
        finally:
            call.cancel()

    async def compact(self, **params: Any) -> dict[str, Any]:
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
            "output": [item_to_dict(i) for i in reply.output],
            "usage": usage_to_dict(reply.usage),
        }

    async def count_input_tokens(self, **params: Any) -> int:
        """The prompt tokens a create with ``params`` would use."""
        reply = await self._unary(
            self._stub.CountInputTokens, pb.CountInputTokensRequest(params=params_to_pb(params))
        )
        return int(reply.input_tokens)

    async def list_models(self) -> list[dict[str, Any]]:
        """The configured models (``id``, ``object``, ``created``, ``owned_by``)."""
        reply = await self._unary(self._stub.ListModels, pb.ListModelsRequest())
        return [flat_message_to_dict(m) for m in reply.data]

    async def get_model(self, model: str) -> dict[str, Any]:
        """One configured model; ResponsesError ``model_not_found`` if unknown."""
        reply = await self._unary(self._stub.GetModel, pb.GetModelRequest(model=model))
        return flat_message_to_dict(reply.model)

    async def stats(self) -> dict[str, Any]:
        """The server's cumulative counters."""
        reply = await self._unary(self._stub.GetStats, pb.GetStatsRequest())
        return flat_message_to_dict(reply)


def _accept_deep_replies(stub: Any, channel: grpc.aio.Channel) -> None:
    """Replace the stub's calls with ones whose replies may nest past protobuf's default of
    100 levels: the server echoes tool schemas (Structs) as deep as it accepts them."""
    service = pb.DESCRIPTOR.services_by_name["ResponsesService"]
    for method in service.methods:
        request_class = getattr(pb, method.input_type.name)
        reply_class = getattr(pb, method.output_type.name)
        path = f"/{service.full_name}/{method.name}"
        kind = (
            channel.stream_stream
            if method.client_streaming
            else channel.unary_stream
            if method.server_streaming
            else channel.unary_unary
        )
        setattr(
            stub,
            method.name,
            kind(
                path,
                request_serializer=request_class.SerializeToString,
                response_deserializer=functools.partial(decode_message, reply_class),
            ),
        )
