"""The deltas of one read of the backend's stream travel on as one event (the server merges
them anyway); with merging off (``streaming.coalesce_deltas = false``) each token's delta is
its own event. Either way the text and the token ids are the model's, in order."""

from __future__ import annotations

import asyncio

import pytest
from bidi_responses.server.core.ports import Delta, EngineEvent, EngineRequest, ItemEnd, ItemStart
from bidi_responses.server.core.rendering.tokenizer import load_encoding
from bidi_responses.server.engine_config import CompletionsConfig
from bidi_responses.server.engines.completions import CompletionsEngine
from bidi_responses.server.engines.harmony import load_harmony

from tests.engines.test_formats import ANSWER
from tests.llama.bad_backends import bad_backends


async def _events(mode: str, merge: bool) -> tuple[list[EngineEvent], list[int]]:
    answer = load_harmony().encode(ANSWER, allowed_special="all")
    async with bad_backends() as backend:
        backend.replies = [answer, answer]
        config = CompletionsConfig(base_url=backend.base_url(mode), format="harmony")
        engine = CompletionsEngine(config, load_encoding())
        request = EngineRequest(prompt_tokens=[1, 2, 3], tools=(), merge_deltas=merge)
        try:
            events = [event async for event in engine.generate(request)]
            again = [event async for event in engine.generate(request)]
        finally:
            await engine.aclose()
    # The same answer again (read boundaries may differ; the text may not).
    assert [e.text for e in again if isinstance(e, Delta)] != []
    assert "".join(e.text for e in again if isinstance(e, Delta)) == "".join(
        e.text for e in events if isinstance(e, Delta)
    )
    # The backend set a cookie with its first answer; no request carried one.
    assert backend.cookies == [None, None]
    return events, answer


def _items(events: list[EngineEvent]) -> list[tuple[str, str, int]]:
    """Per item: its kind, its text and how many deltas carried it."""
    items: list[tuple[str, str, int]] = []
    for event in events:
        if isinstance(event, ItemStart):
            items.append((event.kind, "", 0))
        elif isinstance(event, Delta):
            kind, text, count = items[-1]
            items[-1] = (kind, text + event.text, count + 1)
    return items


def _ids(events: list[EngineEvent]) -> list[int]:
    return [i for e in events if isinstance(e, Delta) for i in e.token_ids]


EXPECTED = [("reasoning", "Done; summarise."), ("message", "Two files: a.txt and b.txt.")]


@pytest.mark.timeout(30)
async def test_a_burst_of_chunks_is_one_delta_per_item_with_every_token() -> None:
    merged, answer = await _events("burst", merge=True)
    one_by_one, _ = await _events("burst", merge=False)
    for events in (merged, one_by_one):
        assert [(kind, text) for kind, text, _ in _items(events)] == EXPECTED
        assert sum(isinstance(e, ItemEnd) for e in events) == 2
    assert _ids(merged) == _ids(one_by_one)
    assert set(_ids(merged)) <= set(answer)
    # Off: a delta per token of text; on: the read's tokens of an item together.
    assert sum(count for *_, count in _items(one_by_one)) == len(_ids(one_by_one))
    assert [count for *_, count in _items(merged)] == [1, 1]


@pytest.mark.timeout(30)
async def test_chunks_that_come_apart_stay_whole_when_merged() -> None:
    async with asyncio.timeout(20):
        merged, _ = await _events("replay", merge=True)
    assert [(kind, text) for kind, text, _ in _items(merged)] == EXPECTED
