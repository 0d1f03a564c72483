"""``ConnectStream``: one Connect call, its lanes, and the turns run on them.

A reader task takes every message off the call and queues it on its lane (``stream_id``);
a turn sends ``response.create`` or ``response.append`` and reads its lane until the event that
ends the turn. Messages are decoded to JSON-shaped events only when someone asks for them.
Steering acknowledgements and automatic successors are sorted out first (``steering``), so a
lane's queue holds only the events of the turns its callers started.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc
from bidi_responses.codec import (
    EventDecoder,
    deep_messages,
    item_to_pb,
    params_to_pb,
    steer_to_pb,
    unbatch,
)
from bidi_responses.v1 import responses_pb2 as pb

from .channel import ConnectCall, status_error
from .outcome import TURN_END_CASES, collect_response, turn_outcome
from .steering import Steering, SuccessorQueue
from .types import (
    JSONMapping,
    JSONObject,
    JSONValue,
    NoSuccessor,
    Response,
    ResponseInput,
    ResponsesError,
    SteerAck,
)

__all__ = ["ConnectStream", "StreamLane"]


class ConnectStream:
    """One Connect stream: a connection-scoped cache on the server, several lanes on it.

    Each lane (``stream_id``) runs one response at a time: a create on a busy lane waits its
    turn (here, until the lane's previous turn has ended), so several tasks may share a lane.
    Use one lane per agent to run agents in parallel over one stream; a create may continue
    (fork) a response of another lane. In append mode the turn ends at ``response.done``: keep
    the lane to one task until the response's terminal event.
    """

    def __init__(self, call: ConnectCall, delivery: pb.DeliveryOptions | None = None) -> None:
        self._call = call
        # Sent with the first message: how the server should deliver this stream's events.
        self._delivery = delivery
        # Function schemas go out as JSON text when the stream asked for them so back.
        self._json_parameters = delivery is not None and delivery.tool_parameters_json
        self._decoder = EventDecoder()
        # Raw messages per lane: they are decoded only when someone asks for events, so
        # ``create()`` pays for the terminal event alone.
        self._lanes: dict[str, asyncio.Queue[pb.ConnectResponse | None]] = {}
        # The turn in flight on each lane; later creates wait for it, in the order they came.
        self._turns: dict[str, _Turn] = {}
        self._steering = Steering()
        # grpc.aio allows one write at a time per call; lanes share the call.
        self._write_lock = asyncio.Lock()
        self._reader = asyncio.get_running_loop().create_task(self._read())
        self.warnings: list[JSONObject] = []
        #: gRPC messages received so far (a batch is one message carrying several events).
        self.messages_received = 0

    async def established(self) -> None:
        """Wait until the server has accepted the stream (its initial metadata arrived), so
        the call's set-up is not paid inside the first turn."""
        try:
            await self._call.initial_metadata()
        except grpc.aio.AioRpcError as error:
            raise status_error(error) from None

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
                    route = self._steering.route(message)
                    if route == "lane":
                        self._queue(message.stream_id).put_nowait(message)
                    elif route != "consumed":
                        route.put_nowait(message)  # an automatic successor's event
        except grpc.aio.AioRpcError as error:
            closing = status_error(error)
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
            self._steering.close(ResponsesError("stream_closed", "the stream has ended"))
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

    async def events(self, stream_id: str = "") -> AsyncIterator[JSONObject]:
        """Every event that arrives on a lane, until the stream ends."""
        queue = self._queue(stream_id)
        while True:
            message = await queue.get()
            if message is None:
                return
            turn = self._turns.get(stream_id)
            if turn is not None and turn.left and message.WhichOneof("event") in TURN_END_CASES:
                self._release(stream_id, turn)  # the end of a turn its consumer left
            yield self._decoder.event(message)

    async def create_events(
        self, *, stream_id: str = "", **params: JSONValue
    ) -> AsyncGenerator[JSONObject, None]:
        """Send ``response.create`` and yield its events up to the terminal (or error) one.

        In append mode the iteration also stops at ``response.done``; answer it with
        ``append_events``.

        The lane is free as soon as the event that ends the turn is yielded, so a loop that
        breaks out at ``response.completed`` can create the next response at once. A consumer
        that stops before that event (breaks, or closes the generator) leaves the response
        running; the lane's next ``create`` first reads the rest of that turn (its events are
        dropped), so each turn gets only its own events. To stop the work as well, ``cancel``
        the response before breaking; to see the rest, read ``events()``.
        """
        turn = await self._claim(stream_id)
        ended = False
        try:
            async for message in self._create_messages(stream_id, params):
                if message.WhichOneof("event") in TURN_END_CASES:
                    ended = True
                    self._release(stream_id, turn)  # free before the consumer sees the end
                yield self._decoder.event(message)
                turn.owner = asyncio.current_task()  # who reads on (see ``_claim``)
        finally:
            if not ended:
                turn.left = True

    async def _claim(self, stream_id: str) -> _Turn:
        """Take a lane for one response: after the turn in flight ends (creates wait in the order
        they came), and once the rest of a turn its consumer left has been read."""
        current = asyncio.current_task()
        passes = 0
        while (turn := self._turns.get(stream_id)) is not None:
            # The same task starting another turn has left the previous one, even if asyncio
            # has not closed the dropped generator yet (it does so later, in a task).
            if turn.finishing is None and (turn.left or turn.owner is current):
                self._finish(stream_id, turn)
            if turn.finishing is not None:
                await asyncio.shield(turn.finishing)
            elif passes < 2:
                # Another task held the lane: if it dropped its generator, asyncio's finalizer
                # closes it within two passes of the loop (a callback, then a task).
                passes += 1
                await asyncio.sleep(0)
            else:
                # Another task's response is in flight: wait for its turn to end, as the
                # server queues a create on a busy lane.
                await turn.ended.wait()
        turn = self._turns[stream_id] = _Turn(current)
        return turn

    def _release(self, stream_id: str, turn: _Turn) -> None:
        if self._turns.get(stream_id) is turn:
            del self._turns[stream_id]
        turn.ended.set()

    def _finish(self, stream_id: str, turn: _Turn) -> None:
        """Read (and drop) the rest of a turn whose consumer stopped early, then free the
        lane."""

        async def finish() -> None:
            try:
                async for _ in self._until_turn_ends(stream_id):
                    pass
            except ResponsesError:
                pass  # the stream ended: nothing more will arrive on the lane
            finally:
                self._release(stream_id, turn)

        turn.finishing = asyncio.get_running_loop().create_task(finish())

    @contextlib.asynccontextmanager
    async def _occupy(self, stream_id: str) -> AsyncIterator[None]:
        """Hold a lane for one response (see ``_claim``), freed when the block ends."""
        turn = await self._claim(stream_id)
        try:
            yield
        finally:
            self._release(stream_id, turn)

    async def _create_messages(
        self, stream_id: str, params: JSONObject
    ) -> AsyncIterator[pb.ConnectResponse]:
        self._queue(stream_id)  # before sending: the end of the stream must reach this lane
        with deep_messages():  # tool schemas may nest past protobuf's default depth
            request = pb.ConnectRequest(stream_id=stream_id)
            params_to_pb(
                params, json_parameters=self._json_parameters, into=request.response_create
            )
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
            if message.WhichOneof("event") in TURN_END_CASES:
                return

    async def create(self, *, stream_id: str = "", **params: JSONValue) -> Response:
        """Create a response and wait for it; raises ResponsesError on an error event."""
        async with self._occupy(stream_id):
            return await self._collect(self._create_messages(stream_id, params))

    async def append_events(
        self, response_id: str, input: Sequence[JSONMapping], *, stream_id: str = ""
    ) -> AsyncGenerator[JSONObject, None]:
        """Send ``response.append`` (tool outputs) and yield events until the next pause/end."""
        await self._send_append(response_id, input, stream_id)
        async for message in self._until_turn_ends(stream_id):
            yield self._decoder.event(message)

    async def append(
        self, response_id: str, input: Sequence[JSONMapping], *, stream_id: str = ""
    ) -> Response:
        """Append tool outputs and wait for the next ``response.done`` or the terminal event."""
        await self._send_append(response_id, input, stream_id)
        return await self._collect(self._until_turn_ends(stream_id))

    async def _send_append(
        self, response_id: str, input: Sequence[JSONMapping], stream_id: str
    ) -> None:
        with deep_messages():
            request = pb.ConnectRequest(
                stream_id=stream_id,
                response_append=pb.ResponseAppend(
                    response_id=response_id, input=[item_to_pb(i) for i in input]
                ),
            )
        await self.send(request)

    async def _collect(self, messages: AsyncIterator[pb.ConnectResponse]) -> Response:
        """The turn's outcome, decoding only the message that ends it."""
        async for message in messages:
            if message.WhichOneof("event") in TURN_END_CASES:
                return turn_outcome(self._decoder.event(message))
        raise ResponsesError("stream_closed", "the stream ended before the response did")

    async def steer(self, *, previous_response_id: str, input: ResponseInput) -> SteerAck:
        """Queue user input for a response in flight (after its ``response.created``) and
        return the server's acknowledgement: ``accepted`` (it owns the input) or refused
        (``ack.error``; nothing queued, the input comes back in ``ack.input``).

        An accepted steer stops the response at a safe output boundary (it ends
        ``incomplete``, reason ``steered``, or ``completed`` if it finished first), and an
        automatic successor runs on the same lane: ``follow`` returns it. Do not create on that
        parent yourself meanwhile. Steer events carry no lane: the target's is used.
        """
        future = self._steering.expect(previous_response_id)
        try:
            await self.send(
                pb.ConnectRequest(response_steer=steer_to_pb(previous_response_id, input))
            )
        except BaseException:
            self._steering.forget(previous_response_id, future)
            raise
        return await future

    async def follow_events(self, previous_response_id: str) -> AsyncGenerator[JSONObject, None]:
        """The events of the automatic successor of a steered response, from its
        ``response.created`` (the commit point of the steering input) to its terminal event.

        Raises ``NoSuccessor`` when none comes: the steer was returned after acceptance
        (``response.steer.failed``), or the response waits for tool outputs
        (``response.steer.pending``; send them in a create on the same lane with this
        ``previous_response_id``, and the server puts the steering input first).
        """
        queue = await self._steering.successor(previous_response_id)
        if queue is None:
            raise NoSuccessor(
                self._steering.outcome(previous_response_id)
                or {
                    "type": "response.steer.failed",
                    "error": {
                        "code": "no_successor",
                        "message": "no steer of this client was accepted for this response",
                    },
                }
            )
        async for message in self._until_end_of(queue):
            yield self._decoder.event(message)

    async def follow(self, previous_response_id: str) -> Response:
        """The automatic successor of a steered response, once it has ended (``NoSuccessor``
        when none comes; see ``follow_events``)."""
        return await collect_response(self.follow_events(previous_response_id))

    @staticmethod
    async def _until_end_of(queue: SuccessorQueue) -> AsyncIterator[pb.ConnectResponse]:
        while True:
            message = await queue.get()
            if message is None:
                raise ResponsesError("stream_closed", "the stream ended before the response did")
            yield message
            if message.WhichOneof("event") in TURN_END_CASES:
                return

    async def cancel(self, response_id: str = "", *, stream_id: str = "") -> None:
        """Ask the server to stop the lane's in-flight response."""
        await self.send(
            pb.ConnectRequest(
                stream_id=stream_id, response_cancel=pb.ResponseCancel(response_id=response_id)
            )
        )

    def lane(self, stream_id: str) -> StreamLane:
        """One lane of this stream, as the SDKs' lane helpers give it: its creates take turns,
        and ``final_response`` after a steered one reads the automatic successor."""
        return StreamLane(self, stream_id)

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


class StreamLane:
    """A lane of a ``ConnectStream`` (``stream.lane("a")``): ``create`` and ``create_events``
    on it, ``steer`` of its responses, and ``final_response``, the last response of the lane's
    chain: the latest create's, or its automatic successor's once one was steered."""

    def __init__(self, stream: ConnectStream, stream_id: str) -> None:
        self.stream = stream
        self.id = stream_id
        self._last: Response | None = None

    async def create(self, **params: JSONValue) -> Response:
        """Create on this lane (waits its turn) and return the response."""
        self._last = await self.stream.create(stream_id=self.id, **params)
        return self._last

    def create_events(self, **params: JSONValue) -> AsyncGenerator[JSONObject, None]:
        """Create on this lane and yield its events (see ``ConnectStream.create_events``)."""
        return self.stream.create_events(stream_id=self.id, **params)

    async def steer(self, *, previous_response_id: str, input: ResponseInput) -> SteerAck:
        """See ``ConnectStream.steer`` (the target is on this lane)."""
        return await self.stream.steer(previous_response_id=previous_response_id, input=input)

    async def final_response(self, response: Response | None = None) -> Response:
        """The response that ends the chain of ``response`` (default: this lane's latest
        create): itself, or when it was steered its automatic successor (followed to the end,
        over any further steering of the successor)."""
        current = response or self._last
        if current is None:
            raise ResponsesError("no_response", f"lane '{self.id}' has created nothing yet")
        while True:
            try:
                current = await self.stream.follow(current.id)
            except NoSuccessor:
                self._last = current
                return current


@dataclass(slots=True)
class _Turn:
    """A response in flight on a lane: the task reading its events, and the task reading the
    rest of them once that reader has stopped early and the lane is wanted again."""

    owner: asyncio.Task[object] | None
    #: The consumer stopped before the turn's end.
    left: bool = False
    finishing: asyncio.Task[None] | None = None
    #: Set when the lane is free again (the waiting creates then take their turns in order).
    ended: asyncio.Event = field(default_factory=asyncio.Event)
