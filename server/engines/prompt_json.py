"""A prompt's token ids as JSON text, written once per conversation rather than once per turn.

The token-level completions API takes the whole prompt with every request, and a conversation's
prompt only grows: each turn appends its new input (and the model's output) to the same token
array (``core.conversation.state``). Writing it as JSON from scratch boxes every id into a
Python int first (orjson cannot read an ``array``): at 18k tokens that is ~0.3 ms of every turn,
proportional to the history. ``PromptJson`` keeps, per token array, a copy of the ids it wrote
and their text; the next prompt whose beginning equals that copy (one ``memcmp``) writes only
its new ids and joins them to the kept text. Any other prompt is written in full, so the text
is always that of the ids sent, whatever happened to the array in between.

The memos are bounded in bytes (least recently used dropped first): a fixed cost of the
process, not of the conversations, which the cache budget accounts apart.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence

import orjson

__all__ = ["PromptJson"]

#: What the memos may hold at most (copies of the ids, 4 bytes each, and their text).
DEFAULT_MAX_BYTES = 32 << 20


def _text(ids: Sequence[int]) -> bytes:
    """``1,2,3``: the ids as the inside of a JSON array."""
    values = ids.tolist() if isinstance(ids, array) else list(ids)
    return orjson.dumps(values)[1:-1]


class PromptJson:
    """The JSON array of a prompt's ids, reusing the text written for its beginning."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.held_bytes = 0
        # id(token array) -> (a copy of the ids written, their text). The key only finds a
        # candidate; the comparison with the copy decides, so a reused id is harmless.
        self._memos: OrderedDict[int, tuple[array[int], bytes]] = OrderedDict()

    def dumps(self, tokens: Sequence[int], tail: Sequence[int] = ()) -> bytes:
        """``[...]``: the ids of ``tokens`` then ``tail`` (``tail`` is never kept)."""
        text = self._ids(tokens) if isinstance(tokens, array) else _text(tokens)
        if tail:
            text = b",".join((text, _text(tail))) if text else _text(tail)
        return b"[" + text + b"]"

    def _ids(self, tokens: array[int]) -> bytes:
        key = id(tokens)
        memo = self._memos.pop(key, None)
        text: bytes | None = None
        if memo is not None:
            self.held_bytes -= _size(memo)
            seen, kept = memo
            n = len(seen)
            if n <= len(tokens) and tokens.typecode == seen.typecode and tokens[:n] == seen:
                new = tokens[n:]
                text = b",".join((kept, _text(new))) if new and kept else kept or _text(new)
        if text is None:
            text = _text(tokens)
        memo = (array(tokens.typecode, tokens), text)
        size = _size(memo)
        if size <= self.max_bytes:
            self._memos[key] = memo
            self.held_bytes += size
            while self.held_bytes > self.max_bytes:
                _, dropped = self._memos.popitem(last=False)
                self.held_bytes -= _size(dropped)
        return text


def _size(memo: tuple[array[int], bytes]) -> int:
    seen, text = memo
    return len(seen) * seen.itemsize + len(text)
