"""Large inputs in the pipeline: long texts are scanned in windows that find what one scan
finds, and a large batch is examined in a worker thread while a small one stays inline."""

from __future__ import annotations

import asyncio
import itertools
import threading

import pytest
from bidi_responses.schema import Item
from bidi_responses.server.core.api.requests import CreateRequest
from bidi_responses.server.core.conversation.state import CarriedState
from bidi_responses.server.core.ports import StageCounters
from bidi_responses.server.pipeline import Flag, Pipeline, StageInput
from bidi_responses.server.pipeline.base import (
    WINDOW_CHARS,
    WINDOW_OVERLAP,
    examine_off_loop,
    text_windows,
    window_spans,
)
from bidi_responses.server.pipeline.injection import InjectionClassifier, score_text
from bidi_responses.server.pipeline.secrets import SecretsClassifier
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.pipeline.test_classifiers import INJECTIONS, SECRETS

FILLER = "ok line of ordinary build output 42\n"


def _long(prefix_chars: int, needle: str, total: int = 3 * WINDOW_CHARS) -> str:
    """``needle`` at ``prefix_chars`` inside filler, ``total`` characters in all."""
    head = (FILLER * (prefix_chars // len(FILLER) + 1))[:prefix_chars]
    tail = FILLER * ((total - prefix_chars) // len(FILLER) + 1)
    return (head + "\n" + needle + "\n" + tail)[:total]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3 * WINDOW_CHARS), st.integers(1, WINDOW_OVERLAP // 2))
def test_every_short_span_lies_in_one_window(start: int, length: int) -> None:
    """Windows cover the text, in order, and each span shorter than half the overlap (the
    next window may start up to half the overlap late, at a space) lies whole in one."""
    text = _long(0, "", 3 * WINDOW_CHARS + 777)
    start = min(start, len(text) - length)
    windows = list(window_spans(len(text), text))
    assert windows[0][0] == 0 and windows[-1][1] == len(text)
    assert all(a < b for a, b in windows)
    assert all(b0 > a1 for (_, b0), (a1, _) in itertools.pairwise(windows))
    assert any(a <= start and start + length <= b for a, b in windows), (start, length)
    assert "".join(text_windows(text)) != text  # overlapping, so longer than the text


# Positions around the first window's end, where a window cut would split a needle.
EDGES = [0, WINDOW_CHARS - 40, WINDOW_CHARS - 5, WINDOW_CHARS + WINDOW_OVERLAP - 20]


@pytest.mark.parametrize("where", EDGES)
@pytest.mark.parametrize("kind", ["GitHub token", "AWS access key id"])
def test_secrets_in_a_long_text_are_found_once_wherever_they_are(kind: str, where: int) -> None:
    kinds = [f.kind for f in SecretsClassifier().scan(_long(where, SECRETS[kind]))]
    assert kinds == [kind]


@pytest.mark.parametrize("where", EDGES)
def test_injection_in_a_long_text_scores_as_in_a_short_one(where: int) -> None:
    needle = INJECTIONS["override of prior instructions"]
    assert score_text(_long(where, needle)) == score_text(needle)
    assert score_text(_long(where, "nothing to see")) == (0, [])


class _ThreadSpy:
    """A stage that records which thread examined each batch."""

    name = "spy"

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    async def examine(self, batch: StageInput, carried: CarriedState) -> list[Flag]:
        return await examine_off_loop(batch, self._examine, batch)

    def _examine(self, batch: StageInput) -> list[Flag]:
        self.threads.append(threading.current_thread())
        return []


def _batch(text: str) -> StageInput:
    items: list[Item] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    ]
    return StageInput(
        items, ["input[0]"], CreateRequest("sim-model", items), frozenset(), {}, set()
    )


def test_a_large_batch_is_examined_in_a_worker_thread_and_a_small_one_inline() -> None:
    spy = _ThreadSpy()
    pipeline = Pipeline([spy], offload_chars=1000)

    async def run() -> None:
        counters = StageCounters({}, {})
        await pipeline.run(_batch("x" * 999), {}, counters)
        await pipeline.run(_batch("x" * 1000), {}, counters)

    asyncio.run(run())
    main = threading.main_thread()
    assert spy.threads[0] is main and spy.threads[1] is not main


def test_the_built_in_classifiers_flag_a_large_batch_as_a_small_one() -> None:
    """Off the loop, the classifiers' verdicts and carried state are the same."""
    secret = SECRETS["GitHub token"]
    for text in (secret, _long(WINDOW_CHARS, secret)):
        stage = SecretsClassifier()
        carried: CarriedState = {}
        batch = _batch(text)
        flags = asyncio.run(stage.examine(batch, carried))
        assert [f.code for f in flags] == ["secret_detected"] and carried["found"] == 1
    injection = InjectionClassifier(item_types=("message",))
    flags = asyncio.run(
        injection.examine(_batch(_long(WINDOW_CHARS, INJECTIONS["exfiltration"])), {})
    )
    assert [f.code for f in flags] == ["prompt_injection_suspected"]
