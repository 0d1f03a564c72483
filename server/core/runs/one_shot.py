"""A one-shot create: one response run straight from its request body, without a stream.

Stateless HTTP creates, gRPC ``CreateResponse`` and background responses run here. There is
no session, lane machine or client event: the body is checked, one ``ResponseRun`` runs on a
lane without a cache, and its events are read as they come (``batches``), up to and including
the terminal (or error) event.

The run is a task of its own, as on a stream, so that ``cancel_response`` and a drain can stop
it apart from the reader. Between the two sits a bounded hand-off: the run waits while the
reader is ``outbound_queue_events`` behind, and the reader takes what is ready together.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from bidi_responses.schema import ErrorEvent, JSONObject, ServerEvent

from ..api.errors import ApiError, server_error
from ..api.jsonshape import check_json_shape
from ..tenancy.caller import ANONYMOUS, Caller
from .deps import RunDeps
from .lane import Lane
from .record import TERMINAL_TYPES, answers_to, error_event
from .runner import ResponseRun

if TYPE_CHECKING:
    from ..process.activity import Activity

# Keys of a client event that a create body does not carry.
_EVENT_KEYS = ("type", "stream_id")


class OneShotCreate:
    """One create run without a stream; read its events once with ``batches``."""

    def __init__(self, deps: RunDeps, body: JSONObject, transport: str, caller: Caller) -> None:
        self._deps = deps
        self._body = body
        self._transport = transport
        self._caller = caller
        self._received = time.perf_counter()
        self._ready: deque[ServerEvent] = deque()
        self._bound = max(deps.config.limits.outbound_queue_events, 1)
        self._more = asyncio.Event()  # set when an event is ready or the run ended
        self._room = asyncio.Event()  # set when the reader took events
        self._lane = Lane("", None)
        self._released = False
        self.run: ResponseRun | None = None

    def _refuse(self, data: ErrorEvent) -> None:
        self._deps.metrics.error(self._transport, data["status"], data["error"]["code"])
        self._ready.append(data)

    async def _emit(self, data: ServerEvent) -> None:
        if data["type"] == "error":
            self._deps.metrics.error(self._transport, data["status"], data["error"]["code"])
        self._ready.append(data)
        self._more.set()
        while len(self._ready) > self._bound:
            self._room.clear()
            await self._room.wait()

    def _start(self) -> bool:
        """Check the body and start its run; False when it was refused (an error is ready)."""
        # The body as the create event it stands for: errors say they answer a create.
        event: JSONObject = {**self._body, "type": "response.create"}
        try:
            check_json_shape(event)  # nesting and numbers first, as for any client event
        except Exception as exc:
            if not isinstance(exc, ApiError):
                self._deps.log.exception("create unreadable on a %s call", self._transport)
            error = exc if isinstance(exc, ApiError) else server_error()
            self._refuse(error_event(error.status, error.to_error_object(), answers_to(event)))
            return False
        body = {k: v for k, v in self._body.items() if k not in _EVENT_KEYS}
        run = self.run = ResponseRun(
            self._deps,
            self._lane,
            body,
            self._emit,
            self._transport,
            self._received,
            caller=self._caller,
        )
        self._lane.inflight = run
        task = asyncio.get_running_loop().create_task(run.run(), name=f"response {run.id}")
        run.task = task
        task.add_done_callback(lambda _: self._more.set())
        return True

    async def batches(self, max_events: int = 1) -> AsyncGenerator[list[ServerEvent], None]:
        """The events as lists of what is ready together (at most ``max_events`` each), up to
        and including the terminal or error event; fewer if the run is stopped first.

        Waits only for the first event of a list; nothing is held back to fill one. Closing
        the generator early stops the run (the client went away).
        """
        try:
            started = self._start()
            task = self.run.task if self.run is not None else None
            while True:
                if not self._ready:
                    if not started or task is None or task.done():
                        return
                    self._more.clear()
                    await self._more.wait()
                    continue
                out: list[ServerEvent] = []
                while self._ready and len(out) < max_events:
                    data = self._ready.popleft()
                    out.append(data)
                    if data["type"] in TERMINAL_TYPES or data["type"] == "error":
                        self._room.set()
                        yield out
                        return
                self._room.set()
                yield out
        finally:
            await self.stop()

    async def wait(self) -> None:
        """Wait until the run has ended (a drain lets it finish)."""
        task = self.run.task if self.run is not None else None
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    async def stop(self) -> None:
        """Stop the run if it still runs (its usage is kept), and release its lane."""
        task = self.run.task if self.run is not None else None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._more.set()  # a reader waiting for more finds the run ended
        if not self._released:
            self._released = True
            await self._lane.affinity.aclose()


class OneShotRuns:
    """The one-shot creates in progress: started by ``respond_batches``, waited for or
    stopped by a drain."""

    def __init__(self, deps: RunDeps, activity: Activity) -> None:
        self._deps = deps
        self._activity = activity
        self._calls: set[OneShotCreate] = set()

    async def respond_batches(
        self, body: JSONObject, transport: str, caller: Caller = ANONYMOUS, max_events: int = 1
    ) -> AsyncGenerator[list[ServerEvent], None]:
        """One create without a stream: its events up to and including the terminal (or
        error) one, as lists of the events ready together (at most ``max_events`` each).
        Closing it early stops the response."""
        call = OneShotCreate(self._deps, body, transport, caller)
        self._calls.add(call)
        self._activity.begin()
        try:
            batches = call.batches(max_events)
            async with contextlib.aclosing(batches):
                async for batch in batches:
                    yield batch
        finally:
            self._calls.discard(call)
            await call.stop()
            await self._activity.end()

    async def respond(
        self, body: JSONObject, transport: str, caller: Caller = ANONYMOUS
    ) -> AsyncGenerator[ServerEvent, None]:
        """``respond_batches`` one event at a time."""
        batches = self.respond_batches(body, transport, caller)
        async with contextlib.aclosing(batches):
            async for batch in batches:
                for data in batch:
                    yield data

    async def wait_all(self) -> None:
        """Let every one-shot create in progress end (a drain)."""
        await asyncio.gather(*(call.wait() for call in list(self._calls)), return_exceptions=True)

    async def stop_all(self) -> None:
        """Stop every one-shot create in progress (each keeps its ledger row)."""
        await asyncio.gather(*(call.stop() for call in list(self._calls)), return_exceptions=True)
