"""Chat formats: incremental render equals full render for every format (property-based),
Harmony renders as ``openai-harmony`` does, and sampled token streams parse into items."""

from __future__ import annotations

from typing import Any

import openai_harmony as oh
import pytest
from bidi_responses.schema import part_text
from bidi_responses.server.core.conversation.state import ConversationState
from bidi_responses.server.core.ports import Delta, EngineEvent, ItemEnd, ItemStart
from bidi_responses.server.core.rendering.tokenizer import load_encoding
from bidi_responses.server.engines.format_choice import build_format
from bidi_responses.server.engines.formats import ITEM_FORMATS, ChatFormat
from bidi_responses.server.engines.harmony import developer_message, load_harmony
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.test_render import CODEC, Conversation, conversations

ENCODING = load_encoding()
FORMAT = {name: build_format(name, ENCODING, CODEC.summary) for name in ITEM_FORMATS}


@pytest.mark.parametrize("name", ITEM_FORMATS)
@settings(max_examples=60, deadline=None)
@given(conversation=conversations(), data=st.data())
def test_incremental_render_equals_full_render(
    name: str, conversation: Conversation, data: st.DataObject
) -> None:
    renderer = FORMAT[name].renderer
    instructions, tools, items = conversation
    full = renderer.render_conversation(instructions, tools, items)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(items)), max_size=5)))
    state = ConversationState()
    state.set_prefix(renderer, instructions, tools, (instructions, tools, None))
    start = 0
    for cut in [*cuts, len(items)]:
        renderer.render_items(items[start:cut], state.call_names, state.tokens)
        start = cut
    assert list(state.tokens) == list(full)


def _harmony_messages(conversation: Conversation) -> list[oh.Message]:
    """The same conversation built directly with openai-harmony's own types."""
    instructions, tools, items = conversation
    messages = [oh.Message.from_role_and_content(oh.Role.SYSTEM, oh.SystemContent.new())]
    functions = [
        oh.ToolDescription.new(t["name"], t["description"] or "", t["parameters"]) for t in tools
    ]
    developer = developer_message(instructions, functions)
    if developer is not None:
        messages.append(developer)
    names: dict[str, str] = {}
    for item in items:
        if item["type"] == "message":
            text = "".join(part_text(part) for part in item["content"])
            if item["role"] == "assistant":
                message = oh.Message.from_role_and_content(oh.Role.ASSISTANT, text)
                messages.append(message.with_channel("final"))
            else:
                messages.append(oh.Message.from_role_and_content(oh.Role(item["role"]), text))
        elif item["type"] == "function_call":
            names[item["call_id"]] = item["name"]
            messages.append(
                oh.Message.from_role_and_content(oh.Role.ASSISTANT, item["arguments"])
                .with_channel("commentary")
                .with_recipient(f"functions.{item['name']}")
                .with_content_type("<|constrain|>json")
            )
        elif item["type"] == "function_call_output":
            author = oh.Author.new(oh.Role.TOOL, f"functions.{names[item['call_id']]}")
            messages.append(
                oh.Message.from_author_and_content(author, item["output"])
                .with_channel("commentary")
                .with_recipient("assistant")
            )
        elif item["type"] == "reasoning":
            text = "\n".join(part["text"] for part in item["summary"])
            message = oh.Message.from_role_and_content(oh.Role.ASSISTANT, text)
            messages.append(message.with_channel("analysis"))
        elif item["type"] == "compaction":
            summary = CODEC.summary(item["encrypted_content"])
            text = "# Compacted conversation\n" + summary
            messages.append(oh.Message.from_role_and_content(oh.Role.DEVELOPER, text))
    return messages


@settings(max_examples=60, deadline=None)
@given(conversation=conversations())
def test_harmony_render_is_openai_harmonys_own(conversation: Conversation) -> None:
    harmony = load_harmony()
    expected = harmony.render_conversation(
        oh.Conversation.from_messages(_harmony_messages(conversation)),
        oh.RenderConversationConfig(auto_drop_analysis=False),
    )
    instructions, tools, items = conversation
    ours = FORMAT["harmony"].renderer.render_conversation(instructions, tools, items)
    assert list(ours) == expected


def _sampled(text: str) -> list[int]:
    """What a gpt-oss model samples, as token ids (recorded by encoding its text)."""
    tokens: list[int] = load_harmony().encode(text, allowed_special="all")
    return tokens


def _parse(chat_format: ChatFormat, tokens: list[int]) -> tuple[list[EngineEvent], bool]:
    parser = chat_format.new_parser()
    events: list[EngineEvent] = []
    for token in tokens:
        events += parser.feed(token)
    events += parser.close()
    return events, parser.finished


def _items(events: list[EngineEvent]) -> list[tuple[str, str, str]]:
    """(kind, name, text) per item, from the events."""
    out: list[tuple[str, str, str]] = []
    current: list[Any] | None = None
    for event in events:
        if isinstance(event, ItemStart):
            current = [event.kind, event.name, ""]
        elif isinstance(event, Delta):
            assert current is not None
            current[2] += event.text
        elif isinstance(event, ItemEnd):
            assert current is not None
            out.append((current[0], current[1], current[2]))
            current = None
    return out


# Completions as a gpt-oss model samples them after <|start|>assistant.
TOOL_CALL = (
    "<|channel|>analysis<|message|>The user wants the files listed. Use exec_command.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.exec_command <|constrain|>json"
    '<|message|>{"cmd":"ls -la","workdir":"/tmp"}<|call|>'
)
ANSWER = (
    "<|channel|>analysis<|message|>Done; summarise.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Two files: a.txt and b.txt.<|return|>"
)


@pytest.mark.parametrize("name", ITEM_FORMATS)
def test_tool_call_parses_from_a_recorded_stream(name: str) -> None:
    events, finished = _parse(FORMAT[name], _sampled(TOOL_CALL))
    assert finished
    assert _items(events) == [
        ("reasoning", "", "The user wants the files listed. Use exec_command."),
        ("function_call", "exec_command", '{"cmd":"ls -la","workdir":"/tmp"}'),
    ]


@pytest.mark.parametrize("name", ITEM_FORMATS)
def test_reasoning_then_answer_parses_from_a_recorded_stream(name: str) -> None:
    events, finished = _parse(FORMAT[name], _sampled(ANSWER))
    assert finished
    assert _items(events) == [
        ("reasoning", "", "Done; summarise."),
        ("message", "", "Two files: a.txt and b.txt."),
    ]


@pytest.mark.parametrize("name", ITEM_FORMATS)
def test_nothing_after_the_stop_token_is_read(name: str) -> None:
    tokens = _sampled(ANSWER + "<|start|>assistant<|channel|>final<|message|>more<|return|>")
    events, _ = _parse(FORMAT[name], tokens)
    assert [kind for kind, _, _ in _items(events)] == ["reasoning", "message"]


@pytest.mark.parametrize("name", ITEM_FORMATS)
def test_a_truncated_answer_ends_its_item(name: str) -> None:
    tokens = _sampled("<|channel|>final<|message|>Two files: a.txt and")
    events, finished = _parse(FORMAT[name], tokens)
    assert not finished
    assert _items(events) == [("message", "", "Two files: a.txt and")]


@pytest.mark.parametrize("name", ITEM_FORMATS)
def test_a_forced_call_header_parses_as_the_models_own(name: str) -> None:
    chat_format = FORMAT[name]
    header = chat_format.call_header("exec_command")
    events, finished = _parse(chat_format, [*header, *_sampled('{"cmd":"pwd"}<|call|>')])
    assert finished
    assert _items(events) == [("function_call", "exec_command", '{"cmd":"pwd"}')]


def test_multibyte_text_split_across_tokens_streams_whole_characters() -> None:
    text = "漢字 é 🎉"
    events, _ = _parse(FORMAT["generic"], _sampled(f"<|channel|>final<|message|>{text}<|return|>"))
    deltas = [event.text for event in events if isinstance(event, Delta)]
    assert "".join(deltas) == text
    assert all("\ufffd" not in delta for delta in deltas)
