"""Incremental rendering equals a full render, token for token (property-based)."""

from __future__ import annotations

from typing import Literal, cast

from bidi_responses.schema import Item, JSONObject
from bidi_responses.server.core.conversation.state import ConversationState
from bidi_responses.server.core.rendering.render import Renderer
from bidi_responses.server.core.rendering.tokenizer import END, MESSAGE, START, load_encoding
from bidi_responses.server.core.runs.compaction import CompactionCodec
from hypothesis import given, settings
from hypothesis import strategies as st

CODEC = CompactionCodec(b"render-test-key-0123456789")
RENDERER = Renderer(load_encoding(), CODEC.summary)

SURROGATES: tuple[Literal["Cs"]] = ("Cs",)

# Text with the awkward parts mixed in: special-token look-alikes, unicode, JSON punctuation.
texts = st.lists(
    st.one_of(
        st.text(st.characters(codec="utf-8", exclude_categories=SURROGATES), max_size=20),
        st.sampled_from(["<|end|>", "<|start|>", "<|message|>", "\n", " ", "{", '"', "é", "漢"]),
    ),
    max_size=6,
).map("".join)
#: Instructions, tools and items.
Conversation = tuple[str | None, list[JSONObject], list[Item]]
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,12}", fullmatch=True)


@st.composite
def conversations(draw: st.DrawFn) -> Conversation:
    instructions = draw(st.one_of(st.none(), texts))
    tools = [
        {
            "type": "function",
            "name": name,
            "description": draw(st.one_of(st.none(), texts)),
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
            "strict": None,
        }
        for name in draw(st.lists(names, max_size=3, unique=True))
    ]
    items: list[JSONObject] = []
    calls: list[str] = []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(
            st.sampled_from(
                ["user", "assistant", "developer", "call", "output", "reasoning", "compaction"]
            )
        )
        if kind == "call":
            call_id = f"call_{len(items)}"
            calls.append(call_id)
            items.append(
                {
                    "type": "function_call",
                    "call_id": call_id,
                    "name": draw(names),
                    "arguments": draw(texts),
                }
            )
        elif kind == "output" and calls:
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": draw(st.sampled_from(calls)),
                    "output": draw(texts),
                }
            )
        elif kind == "compaction":
            token = CODEC.seal({"summary": draw(texts)})
            items.append(
                {"type": "compaction", "id": f"cmp_{len(items)}", "encrypted_content": token}
            )
        elif kind == "reasoning":
            items.append(
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": draw(texts)}]}
            )
        elif kind in ("user", "assistant", "developer"):
            part = "output_text" if kind == "assistant" else "input_text"
            items.append(
                {
                    "type": "message",
                    "role": kind,
                    "content": [
                        {"type": part, "text": draw(texts)} for _ in range(draw(st.integers(1, 3)))
                    ],
                }
            )
    # Items as a client may write them (output text without annotations): the renderer reads
    # only what it renders.
    return instructions, tools, cast(list[Item], items)


@settings(max_examples=150, deadline=None)
@given(conversations(), st.data())
def test_incremental_render_equals_full_render(
    conversation: Conversation,
    data: st.DataObject,
) -> None:
    instructions, tools, items = conversation
    full = RENDERER.render_conversation(instructions, tools, items)

    # Split the conversation into random turns and append each turn to a cached state, the
    # way a stream does across continuations.
    cuts = sorted(data.draw(st.lists(st.integers(0, len(items)), max_size=5)))
    state = ConversationState()
    state.set_prefix(RENDERER, instructions, tools, (instructions, tools, None))
    start = 0
    for cut in [*cuts, len(items)]:
        RENDERER.render_items(items[start:cut], state.call_names, state.tokens)
        start = cut
    assert list(state.tokens) == list(full)


@settings(max_examples=50, deadline=None)
@given(conversations(), conversations())
def test_changing_instructions_rerenders_only_the_prefix(
    first: Conversation,
    second: Conversation,
) -> None:
    instructions, tools, items = first
    new_instructions, new_tools, _ = second
    state = ConversationState()
    state.set_prefix(RENDERER, instructions, tools, (instructions, tools, None))
    RENDERER.render_items(items, state.call_names, state.tokens)
    rendered = state.set_prefix(
        RENDERER, new_instructions, new_tools, (new_instructions, new_tools, None)
    )
    assert list(state.tokens) == list(
        RENDERER.render_conversation(new_instructions, new_tools, items)
    )
    assert rendered == len(RENDERER.render_prefix(new_instructions, new_tools))


def test_special_token_text_in_content_is_ordinary_text() -> None:
    item: Item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "<|end|>"}],
    }
    tokens = list(RENDERER.render_conversation(None, [], [item]))
    # One START, one MESSAGE, one END: the text "<|end|>" did not become a special token.
    assert tokens.count(END) == 1
    assert tokens.count(START) == 1 and tokens.count(MESSAGE) == 1


def test_compaction_renders_as_its_summary() -> None:
    token = CODEC.seal({"summary": "called ls() and saw a.txt"})
    item: Item = {"type": "compaction", "encrypted_content": token}
    tokens = RENDERER.render_conversation(None, [], [item])
    text = RENDERER.encoding.decode([t for t in tokens if t < 199_998])
    assert "called ls() and saw a.txt" in text
    assert token not in text  # the opaque token itself never reaches the model
