"""What one response run counts as it goes, and the rows made from that count.

Usage (input, cached and output tokens), the pipeline's stage counters, the input items the
run received, and the timings around the engine: kept in one place so the run's lifecycle
(``runner``) only says when something happened and its end (``terminal``) writes the same
figures whether the response finished or its stream was cut short.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from bidi_responses.schema import Item, ResponseObject

from ..conversation.state import ConversationState
from ..observability.stats import ResponseStats
from ..ports import EngineFinish, StageCounters
from ..storage.store import LedgerRow, StoredResponse
from ..tenancy.caller import Caller
from .outcome import ledger_row, stored_response
from .record import ResponseRecord, Usage


def _no_counters() -> StageCounters:
    return StageCounters(items={}, ms={})


@dataclass(slots=True)
class RunAccount:
    """The running count of one response, from its arrival (``received``,
    ``time.perf_counter()``), for ``caller`` on ``transport`` (whose rows it makes)."""

    received: float
    caller: Caller
    transport: str
    usage: Usage = field(default_factory=Usage)
    counters: StageCounters = field(default_factory=_no_counters)
    # The items this response's requests added (its create and its appends), for the store.
    inputs: list[Item] = field(default_factory=list)
    # When the engine's last segment ended (0: it never ran), for the post-inference time.
    engine_end: float = 0.0
    # ``response.created`` went out: from here on the response ends with a ledger row.
    started: bool = False
    # Its post-inference job is queued or written: a cut-short stream must not queue another.
    posted: bool = False

    @property
    def total_tokens(self) -> int:
        """Input and output tokens, as the token quota charges them."""
        return self.usage.input_tokens + self.usage.output_tokens

    def took_input(self, items: list[Item], reused_tokens: int) -> None:
        """New input items, and how many prompt tokens the cached context already had."""
        self.usage.cached_tokens += reused_tokens
        self.inputs.extend(items)

    def skipped_engine(self, stats: ResponseStats, prompt_tokens: int) -> None:
        """``generate: false``: the prompt is counted, the engine never runs."""
        stats.api_pre_ms = self._since_received_ms()
        self.usage.input_tokens = prompt_tokens
        self.engine_end = time.perf_counter()

    def segment_starts(self, stats: ResponseStats, prompt_tokens: int) -> None:
        """An engine segment starts on a prompt of ``prompt_tokens``."""
        self.usage.input_tokens += prompt_tokens
        if stats.engine_runs == 0:
            stats.api_pre_ms = self._since_received_ms()
        stats.engine_runs += 1

    def segment_ends(self, stats: ResponseStats, finish: EngineFinish) -> None:
        """An engine segment finished; its costs as the engine reports them."""
        self.engine_end = time.perf_counter()
        stats.engine_ms += finish.engine_seconds * 1000
        stats.prefill_tokens += finish.prefill_tokens
        stats.engine_prompt_tokens += finish.prompt_tokens
        stats.engine_cached_tokens += finish.cached_tokens
        self.usage.output_tokens += finish.output_tokens

    def settle(self, record: ResponseRecord) -> None:
        """Put the count on the record, at the response's end."""
        record.usage = self.usage
        if self.engine_end:
            record.stats.api_post_ms = (time.perf_counter() - self.engine_end) * 1000

    def ledger_row(self, record: ResponseRecord) -> LedgerRow:
        """The response's usage ledger row."""
        return ledger_row(record, self.usage, self.caller, self.transport)

    def stored(
        self,
        record: ResponseRecord,
        snapshot: ResponseObject,
        state: ConversationState | None,
    ) -> StoredResponse | None:
        """What ``store: true`` keeps of the response (None: nothing)."""
        return stored_response(record, snapshot, state, self.inputs, self.caller.tenant)

    def _since_received_ms(self) -> float:
        return (time.perf_counter() - self.received) * 1000
