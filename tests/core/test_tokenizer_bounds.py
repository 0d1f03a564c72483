"""The bounded encoder: tiktoken's tokens for ordinary text, linear work for long runs.

``encode_bounded`` hands tiktoken segments of at most ``max_piece_chars`` characters, cut at
places where a piece boundary is certain. These properties run with small caps, so that almost
every generated text is cut many times and the certain-boundary rule meets its awkward cases
(marks, contractions, numbers of every Unicode kind, every kind of whitespace).
"""

from __future__ import annotations

from typing import Literal

import regex  # type: ignore[import-untyped]  # tiktoken's own dependency
from bidi_responses.server.core.rendering import tokenizer
from bidi_responses.server.core.rendering.render import Renderer
from bidi_responses.server.core.rendering.tokenizer import (
    O200K_PAT_STR,
    encode_bounded,
    encode_segments,
    load_encoding,
)
from hypothesis import example, given, settings
from hypothesis import strategies as st

ENCODING = load_encoding()
SURROGATES: tuple[Literal["Cs"]] = ("Cs",)
PIECES = regex.compile(O200K_PAT_STR)

# Characters that decide where pieces end: letters of each case class, marks, contractions,
# decimal and other numbers, every kind of whitespace, slashes, punctuation, CJK.
AWKWARD = [
    "a", "Z", "é", "ǅ", "ʰ", "漢", "\u0301", "'", "'s", "'LL", "s", "t",
    "0", "7", "²", "٣", "Ⅻ", " ", "  ", "\t", "\n", "\r\n", "\xa0", "\u3000", "\x1c", "\x0b",
    "/", "//", ".", "!", "{", '"', "<|end|>", "-", "_", "😀",
]  # fmt: skip
texts = st.lists(
    st.one_of(
        st.sampled_from(AWKWARD),
        st.text(st.characters(codec="utf-8", exclude_categories=SURROGATES), max_size=6),
    ),
    max_size=60,
).map("".join)
caps = st.integers(min_value=2, max_value=40)


def spans(text: str, cap: int) -> list[tuple[int, int, bool]]:
    return list(tokenizer._segment_spans(text, cap))


@settings(max_examples=400, deadline=None)
@given(texts, caps)
@example("don't stop", 4)
@example("12345678", 3)
@example("ab\u0301\u0301cd", 3)
def test_ordinary_text_gives_tiktokens_own_tokens(text: str, cap: int) -> None:
    """Without a forced cut (a stretch of cap/2 characters with no certain boundary) the tokens
    are exactly ``encode_ordinary``'s, however often the text was cut."""
    cuts = spans(text, cap)
    if not any(forced for _, _, forced in cuts):
        assert encode_bounded(ENCODING, text, cap) == ENCODING.encode_ordinary(text)


@settings(max_examples=300, deadline=None)
@given(texts, caps)
def test_certain_boundaries_are_piece_boundaries(text: str, cap: int) -> None:
    """Every place the rule calls certain is a boundary of the pattern's own pieces."""
    ends = {match.end() for match in PIECES.finditer(text)}
    for index in range(1, len(text)):
        if tokenizer._certain_boundary(text, index):
            assert index in ends, (text, index)


@settings(max_examples=300, deadline=None)
@given(texts, caps)
def test_segments_are_bounded_and_lossless(text: str, cap: int) -> None:
    """Segments join to the text and none exceeds the cap, so tiktoken's per-piece cost (more
    than linear in a piece) is bounded by the cap and the whole encode is linear in the text."""
    segments = encode_segments(text, cap)
    assert "".join(segments) == text
    assert all(len(segment) <= cap for segment in segments)
    assert ENCODING.decode(encode_bounded(ENCODING, text, cap)) == text


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["a", "!", " ", "\n", "漢", "é", "ab", "a/"]), st.integers(1, 40_000))
def test_long_runs_are_cut_into_bounded_segments(run: str, repeat: int) -> None:
    """A run without a certain boundary is cut at the cap; the work stays linear: the sum of
    squared segment lengths is at most cap * length."""
    text = run * repeat
    cap = tokenizer.MAX_PIECE_CHARS
    segments = encode_segments(text)
    assert max(len(segment) for segment in segments) <= cap
    assert sum(len(segment) ** 2 for segment in segments) <= cap * len(text)
    assert ENCODING.decode(encode_bounded(ENCODING, text)) == text


def test_prose_is_never_force_cut_at_the_default_cap() -> None:
    """Prose, code and numbers: identical tokens at the default cap, and many certain cuts."""
    parts = [
        "The quick brown fox's 12,345 jumps\n",
        "def f(x):\n    return x ** 2  # it's fine\r\n",
        "价格是 3.5 元。然后\uff0c我们继续。",
        "1,2,3,4,5,6,7,8,9,10\n",
    ]
    text = "".join(parts) * 3000
    cuts = spans(text, tokenizer.MAX_PIECE_CHARS)
    assert len(cuts) > 10 and not any(forced for _, _, forced in cuts)
    assert encode_bounded(ENCODING, text) == ENCODING.encode_ordinary(text)


def test_a_run_of_a_million_spaces_renders() -> None:
    """tiktoken alone overflows its regex engine's stack (a panic) on this; the renderer
    cuts it and renders it."""
    renderer = Renderer(ENCODING)
    tokens = renderer.render_prefix(" " * 1_000_000, [])
    assert tokens[0] == tokenizer.START and tokens[-1] == tokenizer.END
    assert ENCODING.decode(list(tokens[3:-1])) == " " * 1_000_000
