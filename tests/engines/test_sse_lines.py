"""The backends' SSE line splitter: whole lines across chunks, blank separators left out, and
a line past its bound refused rather than buffered."""

from __future__ import annotations

import pytest
from bidi_responses.server.core.ports import EngineError
from bidi_responses.server.engines.http_backend import SSELineSplitter, sse_data


def test_lines_come_whole_across_chunks_without_the_blank_separators() -> None:
    lines = SSELineSplitter(1024, "backend")
    stream = b'data: {"a":1}\n\ndata: {"b"' + b":2}\r\n\r\n: comment\n\ndata: [DONE]\n\n"
    got: list[bytes] = []
    for start in range(0, len(stream), 5):  # chunks that cut lines anywhere
        got += lines.feed(stream[start : start + 5])
    assert got == [b'data: {"a":1}', b'data: {"b":2}', b": comment", b"data: [DONE]"]
    assert [sse_data(line) for line in got] == [b'{"a":1}', b'{"b":2}', None, b"[DONE]"]


def test_a_line_longer_than_the_bound_is_refused() -> None:
    lines = SSELineSplitter(16, "backend")
    assert lines.feed(b"data: 0123456789") == []
    with pytest.raises(EngineError, match="longer than 16 bytes"):
        lines.feed(b"abcdef")
