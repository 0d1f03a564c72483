"""Every sampled id kept, and a model's output parsed so that the template renders it again as
the model wrote it (no backend: reports as llama.cpp and vLLM send them, parsers fed ids)."""

from __future__ import annotations

from typing import Any

import pytest
from bidi_responses.schema import Item
from bidi_responses.server.core.ports import Delta, EngineEvent, EngineRequest
from bidi_responses.server.core.rendering.tokenizer import load_encoding
from bidi_responses.server.engines.sampled_ids import IdCounts, TiktokenVocabulary, entry_ids

from tests.engines.test_open_model import chat_format, items_of, renderer, tokenizer

SPLIT = "It is 24 °C in Łódź 🎂, 東京."


def _llama_cpp_entries(ids: list[int], token_bytes: Any) -> list[Any]:
    """``logprobs.content`` as llama.cpp streams it: an entry only where the bytes so far end
    on a whole character, with the id of the token that completed it and all the bytes."""
    entries: list[Any] = []
    held = b""
    for token in ids:
        held += token_bytes(token)
        try:
            text = held.decode()
        except UnicodeDecodeError:
            continue
        entries.append({"id": token, "token": text, "bytes": list(held)})
        held = b""
    return entries


@pytest.mark.parametrize("vocabulary", ["o200k", "template"])
def test_ids_of_a_split_character_are_put_back(vocabulary: str) -> None:
    if vocabulary == "o200k":
        encoding = load_encoding()
        vocab: Any = TiktokenVocabulary(encoding)
        ids = encoding.encode(SPLIT + " 𝄞 ꙮ")  # o200k splits the emoji and these
    else:
        vocab = tokenizer()
        ids = vocab.encode(SPLIT)
    entries = _llama_cpp_entries(ids, vocab.token_bytes)
    assert len(entries) < len(ids)  # llama.cpp's report leaves ids out
    counts = IdCounts()
    assert entry_ids(entries, vocab, counts) == ids
    assert counts.recovered == len(ids) - len(entries)


def test_entries_that_carry_their_own_bytes_only_are_taken_as_they_are() -> None:
    model = tokenizer()
    end = model.token_id("<|im_end|>") or 0
    ids = [*model.encode("Hello world."), end]
    # Special tokens report no bytes.
    entries = [{"id": i, "bytes": [] if i == end else list(model.token_bytes(i))} for i in ids]
    counts = IdCounts()
    assert entry_ids(list(entries), model, counts) == ids
    assert counts.recovered == 0


def _parse(text: str) -> list[EngineEvent]:
    model = tokenizer()
    parser = chat_format("chatml").parser_for(EngineRequest(prompt_tokens=[], tools=()))
    events: list[EngineEvent] = []
    for token in [*model.encode(text), model.token_id("<|im_end|>") or 0]:
        events += parser.feed(token)
    return events + parser.close()


def test_the_separator_before_a_call_is_the_template_s() -> None:
    arguments = '{"city": "Łódź 🎂"}'
    call_json = f'{{"name": "get_weather", "arguments": {arguments}}}'
    written = f"Je regarde.\n<tool_call>\n{call_json}\n</tool_call>"
    events = _parse(written)
    assert [(k, n, t) for k, n, t, _ in items_of(events)] == [
        ("message", "", "Je regarde."),
        ("function_call", "get_weather", arguments),
    ]
    for event in events:
        assert not isinstance(event, Delta) or "\ufffd" not in event.text
    # Rendered again, the items give back exactly what the model wrote after the prompt.
    chatml = renderer("chatml")
    question: Item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Météo ?"}],
    }
    prompt = chatml.render_text(None, [], [question], add_generation_prompt=True)
    message: Item = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Je regarde.", "annotations": []}],
    }
    call: Item = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": arguments,
    }
    again = chatml.render_text(None, [], [question, message, call])
    assert again == prompt + written + "<|im_end|>\n"


def test_newlines_that_no_call_follows_stay_in_the_text() -> None:
    text = "Line one.\n\nLine two.\n"
    assert [t for _, _, t, _ in items_of(_parse(text))] == [text]
