"""The end of a response: cache its state, make its rows durable, send its terminal event.

``finish`` ends a response the client still hears from (completed, incomplete, failed);
``abandon`` ends one whose stream went away, so that its usage is never lost. What is written
is the same either way (``account``, ``outcome``). Both take the parts of the run they use: its
record, account and conversation state, the lane whose cache keeps the state, and how the run
reports its end.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from bidi_responses.schema import Outcome, ResponseObject

from ..conversation.state import ConversationState
from ..observability.metrics import ResponseMetrics
from ..storage.postinference import PostJob, StorageUnavailable
from . import continuation
from .account import RunAccount
from .deps import RunDeps
from .lane import Lane
from .record import ResponseRecord

#: Sends the terminal event of the outcome with the response's final snapshot.
Announce = Callable[[Outcome, ResponseObject], Awaitable[None]]


async def finish(
    deps: RunDeps,
    lane: Lane,
    record: ResponseRecord,
    account: RunAccount,
    state: ConversationState | None,
    metrics: ResponseMetrics,
    announce: Announce,
    outcome: Outcome,
    reason: str | None = None,
) -> None:
    """Post-inference: cache the state, queue ledger/store writes, send the terminal event.
    The run has left its lane (``lane.inflight``) already."""
    if record.status != "cancelled":
        record.status = outcome
    record.incomplete_reason = reason
    record.completed_at = int(time.time()) if outcome == "completed" else None
    account.settle(record)
    snapshot = record.snapshot()
    if (
        state is not None
        and lane.cache is not None
        and record.status in ("completed", "incomplete")
    ):
        if not record.request.store:
            state.stored_chain = False
        evicted = lane.cache.put(record.id, state, lane.id)
        if evicted:
            deps.metrics.cache_evictions.inc(evicted)
    stored = account.stored(record, snapshot, state)
    ledger = account.ledger_row(record)
    deps.limiter.charge_tokens(account.caller.quota_key, account.total_tokens)
    if stored is not None and state is not None and deps.state.draining:
        await continuation.hand_off(deps, record.id, state)
    job = PostJob(stored, ledger)
    if deps.ack_after_write or (stored is not None and deps.config.workers > 1):
        # A shared store (or worker processes sharing the SQLite file, which read stored
        # responses from disk only): the terminal event goes out only once any process can
        # read the response (the write goes on if this task is cancelled).
        account.posted = True
        await deps.post.write_through(job)
    else:
        try:
            # Durable (journal) before the terminal event; the store write comes later.
            await deps.post.put(job)
        except StorageUnavailable as exc:
            # What cannot be made durable is never reported done: the response fails.
            if lane.cache is not None:
                lane.cache.take(record.id)
            outcome = record.status = "failed"
            record.completed_at = None
            record.error = {
                "code": "storage_unavailable",
                "message": f"The response could not be stored ({exc}); it was not kept.",
            }
            snapshot = record.snapshot()
            await deps.post.put(PostJob(None, account.ledger_row(record)))
        account.posted = True  # from here on, a cut-short stream must not queue a second row
    if (
        stored is not None
        and state is not None
        and lane.cache is None
        and outcome != "failed"
        and record.status in ("completed", "incomplete")
    ):
        # No stream keeps this state: the process does, for a continuation over HTTP or a new
        # stream (recent.py), before the terminal event lets the client send one.
        evicted = deps.recent.keep(account.caller.tenant, record.id, state)
        if evicted:
            deps.metrics.cache_evictions.inc(evicted)
    deps.counters.record(record.stats)
    metrics.finished(record.status, record.stats)
    await announce(outcome, snapshot)


def abandon(
    deps: RunDeps,
    record: ResponseRecord | None,
    account: RunAccount,
    state: ConversationState | None,
    metrics: ResponseMetrics,
) -> None:
    """Queue the ledger row of a started response that the stream's end cut short."""
    if record is None or not account.started or account.posted:
        return
    account.posted = True
    record.status = "cancelled"
    record.incomplete_reason = "client_gone"  # the documented reason (IncompleteDetails)
    record.usage = account.usage
    deps.counters.record(record.stats)
    metrics.finished("cancelled", record.stats)
    # No client waits for it, and the stream's task is being cancelled: the queue makes it
    # durable on its own (and its drain waits for it). A ``store: true`` response is stored
    # with the output it had.
    stored = account.stored(record, record.snapshot(), state)
    deps.post.submit(PostJob(stored, account.ledger_row(record)))
