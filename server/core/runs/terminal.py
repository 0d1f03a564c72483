"""The end of a response: cache its state, make its rows durable, send its terminal event.

``finish`` ends a response the client still hears from (completed, incomplete, failed);
``abandon`` ends one whose stream went away, so that its usage is never lost. What is written
is the same either way (``run_account``, ``outcome``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from bidi_responses.schema import Outcome

from ..lanes import continuation
from ..storage.postinference import PostJob, StorageUnavailable
from .record import terminal_event

if TYPE_CHECKING:
    from .runner import ResponseRun


async def finish(run: ResponseRun, outcome: Outcome, reason: str | None = None) -> None:
    """Post-inference: cache the state, queue ledger/store writes, send the terminal event."""
    assert run.record is not None
    deps = run.deps
    lane = run.lane
    record = run.record
    account = run.account
    if record.status != "cancelled":
        record.status = outcome
    record.incomplete_reason = reason
    record.completed_at = int(time.time()) if outcome == "completed" else None
    account.settle(record)
    snapshot = record.snapshot()
    state = run.state
    if (
        state is not None
        and lane.cache is not None
        and record.status in ("completed", "incomplete")
    ):
        if not record.request.store:
            state.stored_chain = False
        evicted = lane.cache.put(run.id, state, lane.id)
        if evicted:
            deps.metrics.cache_evictions.inc(evicted)
    stored = account.stored(record, snapshot, state, run.tenant)
    ledger = account.ledger_row(record, run.caller, run.transport)
    if lane.inflight is run:
        lane.inflight = None
    deps.limiter.charge_tokens(run.quota_key, account.total_tokens)
    if stored is not None and state is not None and deps.state.draining:
        await continuation.hand_off(deps, run.id, state)
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
                lane.cache.take(run.id)
            outcome = record.status = "failed"
            record.completed_at = None
            record.error = {
                "code": "storage_unavailable",
                "message": f"The response could not be stored ({exc}); it was not kept.",
            }
            snapshot = record.snapshot()
            await deps.post.put(
                PostJob(None, account.ledger_row(record, run.caller, run.transport))
            )
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
        evicted = deps.recent.keep(run.tenant, run.id, state)
        if evicted:
            deps.metrics.cache_evictions.inc(evicted)
    deps.counters.record(record.stats)
    run.metrics.finished(record.status, record.stats)
    if run.hooks is not None:
        run.hooks.ending(run)
    await run.emit(terminal_event(outcome, snapshot, run.seq.take()))


def abandon(run: ResponseRun) -> None:
    """Queue the ledger row of a started response that the stream's end cut short."""
    record = run.record
    account = run.account
    if record is None or not account.started or account.posted:
        return
    account.posted = True
    record.status = "cancelled"
    record.incomplete_reason = "client_gone"  # the documented reason (IncompleteDetails)
    record.usage = account.usage
    run.deps.counters.record(record.stats)
    run.metrics.finished("cancelled", record.stats)
    # No client waits for it, and the stream's task is being cancelled: the queue makes it
    # durable on its own (and its drain waits for it). A ``store: true`` response is stored
    # with the output it had.
    stored = account.stored(record, record.snapshot(), run.state, run.tenant)
    run.deps.post.submit(PostJob(stored, account.ledger_row(record, run.caller, run.transport)))
