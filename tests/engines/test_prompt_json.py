"""The prompt's ids as JSON: the kept text of a conversation's beginning is reused only while
the ids it was written from are still there, so the text is always that of the ids sent."""

from __future__ import annotations

import json
from array import array

from bidi_responses.server.engines.prompt_json import PromptJson


def test_a_growing_prompt_is_written_as_its_ids() -> None:
    prompts = PromptJson()
    tokens = array("I", [1, 2, 3])
    assert json.loads(prompts.dumps(tokens, [9])) == [1, 2, 3, 9]
    tokens.extend([4, 5])
    assert json.loads(prompts.dumps(tokens, [9, 10])) == [1, 2, 3, 4, 5, 9, 10]
    tokens.extend([])
    assert json.loads(prompts.dumps(tokens)) == [1, 2, 3, 4, 5]


def test_a_changed_beginning_is_written_again() -> None:
    prompts = PromptJson()
    tokens = array("I", [1, 2, 3, 4])
    prompts.dumps(tokens)
    tokens[1] = 7
    assert json.loads(prompts.dumps(tokens)) == [1, 7, 3, 4]
    del tokens[2:]
    assert json.loads(prompts.dumps(tokens, [8])) == [1, 7, 8]
    del tokens[:]
    assert json.loads(prompts.dumps(tokens)) == []
    assert json.loads(prompts.dumps(tokens, [5])) == [5]


def test_lists_and_the_byte_bound() -> None:
    prompts = PromptJson(max_bytes=64)
    assert json.loads(prompts.dumps([4, 5], [6])) == [4, 5, 6]
    big = array("I", range(100))
    assert json.loads(prompts.dumps(big)) == list(range(100))
    assert prompts.held_bytes == 0  # too large to keep
    small = [array("I", [i, i + 1]) for i in range(10)]
    for tokens in small:
        assert json.loads(prompts.dumps(tokens)) == list(tokens)
    assert prompts.held_bytes <= 64
