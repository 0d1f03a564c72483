"""``make turn-profile`` in small: the per-thread split of a turn's CPU on a real server, and
the phases py-spy's stacks are counted in."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from bidi_responses.bench.turn_profile import LOOP_PHASE, PHASES, phase_of, phase_shares, run


def test_a_stack_counts_in_its_innermost_phase() -> None:
    finish = "finish (bidi_responses/server/core/runs/terminal.py:30)"
    append = "Journal.append (bidi_responses/server/core/storage/journal.py:112)"
    stream = "read_completion (bidi_responses/server/engines/completion_stream.py:68)"
    feed = "CompletionParser.feed (bidi_responses/server/engines/completion_parser.py:65)"
    select = "EpollSelector.select (selectors.py:468)"
    assert phase_of([finish, append]) == "finish: usage, journal, store"
    assert phase_of([finish, stream, feed]) == "engine stream"
    assert phase_of(["_run_once (asyncio/base_events.py:1845)", select]) == LOOP_PHASE
    assert {name for name, _ in PHASES} >= {"render and tokenize", "client write"}


def test_shares_are_the_samples_of_each_phase() -> None:
    raw = (
        "main (cli.py:1);read_completion (server/engines/completion_stream.py:68) 3\n"
        "main (cli.py:1);_run_once (asyncio/base_events.py:1845) 1\n"
        "not a sample line\n"
    )
    assert phase_shares(raw) == {"engine stream": 0.75, LOOP_PHASE: 0.25}
    assert phase_shares("") == {}


@pytest.mark.timeout(180)
def test_a_websocket_turn_is_split_by_thread(tmp_path: Path) -> None:
    results = asyncio.run(asyncio.wait_for(run(["websocket"], 3, None, tmp_path, turns=8), 150))
    (result,) = results
    assert result["mode"] == "websocket"
    assert result["phases"] == {}  # no py-spy: no phases
    # 21 tool turns of a few milliseconds each: some clock ticks, most on the loop's thread.
    assert result["tool_turn_cpu_ms"] > 0
    assert result["event_loop_thread_ms"] > 0
    assert result["worker_threads_ms"] >= 0
