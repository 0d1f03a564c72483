"""What a turn costs on a chat-template route (pytest-benchmark; timings are never asserted).

``make test`` runs each once as a smoke test; time them with
``pytest tests/engines/test_open_model_bench.py --benchmark-enable``. A long agent loop (300
rounds, ~24k tokens of the test vocabulary) gets one more user message, rendered three ways:
from the previous render's memo (what a stream does), tokenized from scratch, and the Jinja
render alone (paid either way: a template renders the whole conversation).
"""

from __future__ import annotations

from bidi_responses.server.engines.chat_template import TemplateRenderer
from pytest_benchmark.fixture import BenchmarkFixture

from tests.engines.test_open_model import WEATHER, agent_loop, renderer, user

ITEMS = [item for turn in agent_loop(300) for item in turn]
NEXT = [*ITEMS, user("One more question.")]


def _chatml() -> TemplateRenderer:
    return renderer("chatml")


def test_turn_from_the_memo(benchmark: BenchmarkFixture) -> None:
    chatml = _chatml()
    tokens, memo, _ = chatml.render_whole("Be brief.", [WEATHER], ITEMS, None)
    after, _, tokenized = benchmark(chatml.render_whole, "Be brief.", [WEATHER], NEXT, memo)
    assert list(after[: len(tokens)]) == list(tokens)
    assert tokenized < 30  # only the new message (from the last added token on)


def test_turn_from_scratch(benchmark: BenchmarkFixture) -> None:
    chatml = _chatml()
    after, _, tokenized = benchmark(chatml.render_whole, "Be brief.", [WEATHER], NEXT, None)
    assert tokenized == len(after) > 20_000


def test_jinja_render_alone(benchmark: BenchmarkFixture) -> None:
    text = benchmark(_chatml().render_text, "Be brief.", [WEATHER], NEXT)
    assert text.endswith("One more question.<|im_end|>\n")
