"""Append mode: a response paused in ``response.done`` until the client sends its tool outputs.

``AppendWait`` owns the calls a paused response waits on and the future an append resolves.
The session offers appends from its reader task (``offer``); the response's own task waits
(``wait``) and checks and renders the items like any other input.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from bidi_responses.schema import FunctionCallItem, Item, JSONValue, ResponseEvent

from ...config import Limits
from ..api.errors import ApiError, not_waiting, shown
from ..api.ids import assign_ids
from ..api.input_items import parse_input
from .prompt import Prompt
from .record import error_event


class AppendWait:
    """The pending calls of one response and the append that answers them."""

    def __init__(self) -> None:
        self.pending_calls: dict[str, FunctionCallItem] = {}
        self._waiter: asyncio.Future[list[Item]] | None = None

    @property
    def waiting(self) -> bool:
        """True while the response waits for tool outputs."""
        return self._waiter is not None and not self._waiter.done()

    def expect(self, calls: list[FunctionCallItem]) -> None:
        """Wait on ``calls`` from now on (an empty list: on nothing)."""
        self.pending_calls = {call["call_id"]: call for call in calls}

    def offer(
        self,
        response_id: str,
        offered_to: str,
        raw_input: JSONValue,
        limits: Limits,
        before: Callable[[], list[Item]],
    ) -> None:
        """Hand an append's input, sent to response ``offered_to``, to this waiting response
        (``response_id``); ApiError unless it waits and the items answer each pending call
        exactly once. ``before``: called once the items are accepted, for items to put in
        front of them (steering input)."""
        if not self.waiting or offered_to != response_id:
            raise not_waiting(offered_to)
        items, _ = parse_input(raw_input, limits)
        assert self._waiter is not None
        outputs = [(i, it) for i, it in enumerate(items) if it["type"] == "function_call_output"]
        answered = [it["call_id"] for _, it in outputs]
        for index, item in outputs:
            if item["call_id"] not in self.pending_calls:
                raise ApiError(
                    f"Invalid 'input[{index}].call_id': '{shown(item['call_id'])}' is not a "
                    f"pending call of response '{response_id}' (pending: "
                    f"{', '.join(self.pending_calls)}).",
                    code="call_id_mismatch",
                    param=f"input[{index}].call_id",
                )
        missing = [c for c in self.pending_calls if c not in answered]
        if missing or len(answered) != len(set(answered)):
            raise ApiError(
                f"Invalid 'input': the append must answer each pending call exactly once; "
                f"missing or repeated: {', '.join(missing) or 'repeated call_id'}.",
                code="call_id_mismatch",
                param="input",
            )
        self._waiter.set_result(before() + items)

    async def next(self, deadline: float) -> list[Item] | None:
        """The next offered append, or None (and no pending calls) once ``deadline``
        (``time.monotonic``) passes."""
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
                return await self._waiter
        except TimeoutError:
            self.pending_calls = {}
            return None
        finally:
            self._waiter = None

    async def wait(
        self,
        response_id: str,
        prompt: Prompt,
        emit: Callable[[ResponseEvent], Awaitable[None]],
        deadline: float,
    ) -> list[Item] | None:
        """The append that answers the pending calls, checked and rendered onto ``prompt``;
        None once ``deadline`` passes. An append the checks refuse gets its error event, and
        the response waits on."""
        while True:
            items = await self.next(deadline)
            if items is None:
                return None
            assign_ids(items)
            paths = [f"input[{i}]" for i in range(len(items))]
            try:
                await prompt.examine(items, paths)
            except ApiError as error:
                answers = {"request_type": "response.append", "response_id": response_id}
                await emit(error_event(error.status, error.to_error_object(), answers))
                continue  # still waiting for an acceptable append
            await prompt.add_append(items)
            self.expect([])
            return items
