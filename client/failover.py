"""A conversation that survives its stream: reconnect through the proxy, resend, never twice.

Behind a proxy with several replicas sharing one PostgreSQL store, a Connect stream ends when
its replica drains (a ``server_draining`` warning, then the stream ends after the turn in
flight) or dies (the call fails with UNAVAILABLE). ``Conversation`` then opens a new stream on
the same channel, so the proxy picks a live replica, and sends the unacknowledged turn again
with the same ``idempotency_key`` and ``previous_response_id``:

* if the first attempt never completed, the new replica runs the turn, continuing from the
  shared store;
* if it completed but its terminal event was lost, the new replica finds the response the key
  names and replays its terminal event: the turn is neither lost nor run twice.

The rules for a client in another language are the same; see docs/replicas.md.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence

from bidi_responses.schema import FunctionCallItem, FunctionCallOutputItem

from .aio import AsyncResponsesClient
from .stream import ConnectStream
from .types import (
    JSONObject,
    JSONValue,
    Response,
    ResponseInput,
    ResponsesError,
)

# Error codes after which the same turn is sent again on a new stream.
RETRYABLE_CODES = frozenset(
    {
        "stream_closed",  # the stream ended before the turn did (drain, proxy reset)
        "server_shutting_down",  # the replica was draining when the turn arrived
        "idempotent_request_in_progress",  # the earlier attempt still runs on a draining replica
        "unavailable",  # the replica or the proxy's upstream went away (gRPC UNAVAILABLE)
        "internal",  # a connection reset surfaced as INTERNAL by the proxy
        "unknown",
        "cancelled",
    }
)


class Conversation:
    """One conversation chain over a client whose target is a proxy (or a single server).

    ``create`` takes the parameters of ``ConnectStream.create``; it keeps the stream, moves
    to a new one when the old one drains or breaks, and numbers the turns' idempotency keys.
    """

    def __init__(
        self,
        client: AsyncResponsesClient,
        *,
        key_prefix: str | None = None,
        deadline_s: float = 60.0,
        backoff_s: float = 0.05,
        max_backoff_s: float = 1.0,
    ) -> None:
        self._client = client
        self._prefix = key_prefix or f"conv_{os.urandom(12).hex()}"
        self._deadline_s = deadline_s
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._stream: ConnectStream | None = None
        self._turn = 0
        # How many times a turn was sent again, and how many streams were opened.
        self.retries = 0
        self.reconnects = 0

    def _open(self) -> ConnectStream:
        if self._stream is None:
            self._stream = self._client.open_stream()
            self.reconnects += 1
        return self._stream

    def _drop(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.abort()

    def _draining(self) -> bool:
        stream = self._stream
        return stream is not None and any(
            w.get("code") == "server_draining" for w in stream.warnings
        )

    async def create(self, **params: JSONValue) -> Response:
        """Send one turn until some replica acknowledges it; returns its response.

        Raises ResponsesError for a rejection that a retry cannot fix (a bad request), or
        TimeoutError when no replica answered within the deadline.
        """
        key = params.pop("idempotency_key", None) or f"{self._prefix}_{self._turn}"
        deadline = time.monotonic() + self._deadline_s
        delay = self._backoff_s
        while True:
            if self._draining():
                self._drop()  # finish here, but send the next turn elsewhere
            stream = self._open()
            try:
                response = await stream.create(idempotency_key=key, **params)
            except ResponsesError as error:
                if error.code not in RETRYABLE_CODES:
                    raise
                self._drop()
                if time.monotonic() + delay > deadline:
                    raise TimeoutError(
                        f"turn {key} not acknowledged within {self._deadline_s:g} s "
                        f"(last error: {error})"
                    ) from error
                self.retries += 1
                await asyncio.sleep(delay)  # backoff before the next attempt
                delay = min(delay * 2, self._max_backoff_s)
                continue
            self._turn += 1
            return response

    async def close(self) -> None:
        """Half-close the current stream and wait for it to end."""
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.close()


async def run_resilient_agent(
    conversation: Conversation,
    *,
    model: str,
    input: ResponseInput,
    tools: Sequence[JSONObject],
    tool_output: Callable[[FunctionCallItem], str],
    turns: int,
    **params: JSONValue,
) -> list[Response]:
    """A chained agent loop of ``turns`` responses that survives replica loss; every turn
    answers each function call with ``tool_output(call) -> str``."""
    tools = list(tools)
    response = await conversation.create(model=model, input=input, tools=tools, **params)
    responses = [response]
    while len(responses) < turns and response.function_calls:
        outputs: list[FunctionCallOutputItem] = [
            {"type": "function_call_output", "call_id": c["call_id"], "output": tool_output(c)}
            for c in response.function_calls
        ]
        response = await conversation.create(
            model=model, input=outputs, tools=tools, previous_response_id=response.id, **params
        )
        responses.append(response)
    return responses
