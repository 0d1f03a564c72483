"""Micro-benchmarks of the per-turn hot path (pytest-benchmark).

``make test`` runs each once as a smoke test (benchmarking disabled) and asserts counters;
``make bench`` times them. Timings are never asserted.
"""

from __future__ import annotations

import orjson
from bidi_responses.codec import ProtoEncoder
from bidi_responses.schema import Item
from bidi_responses.server.core.conversation.state import ConversationState
from bidi_responses.server.core.rendering.render import Renderer
from bidi_responses.server.core.rendering.tokenizer import load_encoding
from pytest_benchmark.fixture import BenchmarkFixture

from tests.conftest import SHELL_TOOL
from tests.workload import tool_output

RENDERER = Renderer(load_encoding())


def _conversation(turns: int, tokens: int) -> list[Item]:
    items: list[Item] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]}
    ]
    for turn in range(turns):
        call_id = f"call_{turn}"
        items.append(
            {
                "type": "function_call",
                "call_id": call_id,
                "name": "exec_command",
                "arguments": '{"cmd": "pytest -x"}',
            }
        )
        items.append(
            {
                "type": "function_call_output",
                "call_id": call_id,
                "output": tool_output(tokens, seed=turn),
            }
        )
    return items


HISTORY = _conversation(25, 4000)


def test_incremental_turn_renders_only_new_input(benchmark: BenchmarkFixture) -> None:
    """One turn on a ~100k-token cached state: render the new tool output and append it."""
    state = ConversationState()
    state.set_prefix(RENDERER, "instructions", [SHELL_TOOL], ("instructions", [SHELL_TOOL], None))
    RENDERER.render_items(HISTORY[:-2], state.call_names, state.tokens)
    base = len(state.tokens)
    new_items = HISTORY[-2:]

    def turn() -> int:
        del state.tokens[base:]
        return RENDERER.render_items(new_items, state.call_names, state.tokens)

    rendered = benchmark(turn)
    assert base > 90_000
    assert rendered < 0.05 * base


def test_full_history_turn_renders_everything(benchmark: BenchmarkFixture) -> None:
    """The same turn without a cache: the whole conversation is rendered again."""
    tokens = benchmark(RENDERER.render_conversation, "instructions", [SHELL_TOOL], HISTORY)
    assert len(tokens) > 95_000


def test_delta_event_framing(benchmark: BenchmarkFixture) -> None:
    """Encoding one output_text.delta event as protobuf and as JSON (the per-event cost)."""
    encoder = ProtoEncoder()
    event = {
        "type": "response.output_text.delta",
        "item_id": "msg_1",
        "output_index": 0,
        "content_index": 0,
        "delta": " token",
        "sequence_number": 7,
    }

    def both() -> tuple[int, int]:
        message = encoder.connect_response("", event)
        return len(message.SerializeToString()), len(orjson.dumps(event))

    proto_bytes, json_bytes = benchmark(both)
    assert 0 < proto_bytes < json_bytes
