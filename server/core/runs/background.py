"""Background mode: responses that run on without their client, polled or resumed later.

``POST /v1/responses`` with ``background: true`` returns at once with the response ``queued``;
the response runs as a task owned here, not by the request. The client polls
``GET /v1/responses/{id}``, cancels with ``POST /v1/responses/{id}/cancel``, or (with
``stream: true``) reads its events and, after a disconnect, resumes them with
``GET /v1/responses/{id}?stream=true&starting_after=N``.

Every response keeps a bounded log of its events (the newest ``max_events``) so that a resume
replays what was missed and then follows live; finished responses keep their logs in a
bounded LRU (``max_finished``). At most ``max_running`` background responses run at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable

from bidi_responses.schema import JSONObject, ServerEvent, snapshot_of

from ...config import BackgroundConfig
from ..api.errors import ApiError, shown
from ..tenancy.caller import Caller
from .record import TERMINAL_TYPES

# Runs one create without a stream and yields its events (``ResponsesCore.respond``).
Respond = Callable[[JSONObject, str, Caller], AsyncGenerator[ServerEvent, None]]


class EventLog:
    """The newest events of one background response, and a way to wait for more."""

    def __init__(self, max_events: int) -> None:
        self._events: deque[ServerEvent] = deque(maxlen=max_events)
        self.total = 0  # events ever appended; the first kept one is number total - len
        self.done = False
        # The owner: another tenant's id is "not found".
        self.tenant: str | None = None
        self._more = asyncio.Event()

    @property
    def first_kept(self) -> int:
        """Index (= sequence number) of the oldest event still kept."""
        return self.total - len(self._events)

    def append(self, event: ServerEvent) -> None:
        """Add the next event and wake the readers."""
        self._events.append(event)
        self.total += 1
        self._wake()

    def finish(self) -> None:
        """No more events will come."""
        self.done = True
        self._wake()

    def _wake(self) -> None:
        self._more.set()
        self._more = asyncio.Event()

    async def follow(self, start: int) -> AsyncIterator[ServerEvent]:
        """Events from index ``start`` on, live until the response ends."""
        cursor = start
        while True:
            while cursor < self.total:
                if cursor < self.first_kept:
                    return  # overtaken by the bound while the reader was slow: stop cleanly
                yield self._events[cursor - self.first_kept]
                cursor += 1
            if self.done:
                return
            await self._more.wait()


class BackgroundRuns:
    """The background responses of one core: their tasks and event logs."""

    def __init__(self, respond: Respond, config: BackgroundConfig) -> None:
        for name in ("max_running", "max_events", "max_finished"):
            if getattr(config, name) < 1:
                raise ValueError(f"background.{name} must be >= 1, got {getattr(config, name)}")
        self._respond = respond
        self._config = config
        self._logs: OrderedDict[str, EventLog] = OrderedDict()
        self._running: set[asyncio.Task[None]] = set()

    async def start(
        self,
        body: JSONObject,
        transport: str,
        caller: Caller,
    ) -> ServerEvent:
        """Start a background response of ``caller``; returns its first event
        (``response.created`` with status ``queued``, or the ``error`` that rejected it)."""
        if len(self._running) >= self._config.max_running:
            raise ApiError(
                f"Too many background responses are running (limit "
                f"{self._config.max_running}); retry later.",
                code="rate_limit_exceeded",
                status=429,
                type="rate_limit_error",
            )
        loop = asyncio.get_running_loop()
        first: asyncio.Future[ServerEvent] = loop.create_future()
        log = EventLog(self._config.max_events)
        log.tenant = caller.tenant
        task = loop.create_task(self._pump(body, transport, first, log, caller), name="background")
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return await asyncio.shield(first)

    async def _pump(
        self,
        body: JSONObject,
        transport: str,
        first: asyncio.Future[ServerEvent],
        log: EventLog,
        caller: Caller,
    ) -> None:
        response_id: str | None = None
        events = self._respond(body, transport, caller)
        try:
            async with contextlib.aclosing(events):
                async for data in events:
                    snapshot = snapshot_of(data) if response_id is None else None
                    if snapshot is not None:
                        response_id = snapshot["id"]
                        self._keep(response_id, log)
                    log.append(data)
                    if not first.done():
                        first.set_result(data)
                    if data["type"] == "error" or data["type"] in TERMINAL_TYPES:
                        break
        finally:
            log.finish()
            if not first.done():
                first.set_exception(
                    ApiError(
                        "The response ended before it started.",
                        code="server_error",
                        status=500,
                        type="server_error",
                    )
                )

    def _keep(self, response_id: str, log: EventLog) -> None:
        self._logs[response_id] = log
        # Bound the logs: running ones are always kept, finished ones oldest-first dropped.
        finished = [rid for rid, kept in self._logs.items() if kept.done]
        excess = len(finished) - self._config.max_finished
        for rid in finished[: max(excess, 0)]:
            del self._logs[rid]

    def is_background(self, response_id: str, tenant: str | None = None) -> bool:
        """Whether ``response_id`` is a background response of ``tenant`` whose events are
        still kept."""
        log = self._logs.get(response_id)
        return log is not None and log.tenant == tenant

    def events(
        self, response_id: str, starting_after: int, tenant: str | None = None
    ) -> AsyncIterator[ServerEvent]:
        """Events after sequence number ``starting_after`` (-1: all), live to the end.

        ApiError if the response is not a kept background response, or if the events asked
        for are no longer kept.
        """
        log = self._logs.get(response_id)
        if log is None or log.tenant != tenant:  # another tenant's: not found, like no id
            raise ApiError(
                f"No background response with id '{shown(response_id)}' has its events kept; only "
                "background responses can be streamed again.",
                code="not_found",
                param="response_id",
                status=404,
            )
        start = starting_after + 1
        if start < log.first_kept:
            raise ApiError(
                f"Invalid 'starting_after': events up to {log.first_kept - 1} are no longer "
                f"kept (at most {self._config.max_events} per response).",
                param="starting_after",
            )
        self._logs.move_to_end(response_id)
        return log.follow(start)

    async def close(self) -> None:
        """Stop every background response (their sessions end, work is cancelled)."""
        tasks = list(self._running)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
