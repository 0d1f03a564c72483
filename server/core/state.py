"""Conversation state and the per-stream cache that keeps it between turns.

A ``ConversationState`` is everything the next turn can reuse: the items so far, their
rendered tokens, the call-id map, the checked tools, the resolved route and the pipeline
stages' own carried state. A continuation *takes* its predecessor's state out of the cache and
appends to it in place (so nothing is copied or rendered twice); on success the new response's
id owns it, and on failure it is dropped, which is why a failed continuation evicts the
response it referenced, exactly as the hosted WebSocket mode does.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from bidi_responses.server.core.render import Renderer, TokenArray
from bidi_responses.server.core.requests import Item


@dataclass(slots=True)
class ConversationState:
    """The reusable state of one conversation after its latest response."""

    tokens: TokenArray = field(default_factory=lambda: array("I"))
    prefix_len: int = 0
    prefix_key: tuple[Any, ...] | None = None
    items: list[Item] = field(default_factory=list)
    call_names: dict[str, str] = field(default_factory=dict)
    answered_calls: set[str] = field(default_factory=set)
    raw_tools: Any = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    model_turns: int = 0
    tool_rounds: int = 0
    # True while every response in the chain was written to the durable store, so a stored
    # continuation can point at its predecessor instead of carrying the whole history.
    stored_chain: bool = True
    last_response: dict[str, Any] | None = None
    stage_state: dict[str, Any] = field(default_factory=dict)
    text_chars: int = 0
    # The chat format ``tokens`` are in (``Renderer.format_name``); a route with another
    # format renders the conversation again.
    format_name: str | None = None

    def approx_bytes(self) -> int:
        """Memory held, for the cache's byte budget: tokens plus item text plus overhead."""
        return self.tokens.itemsize * len(self.tokens) + 2 * self.text_chars + 512 * len(self.items)

    def set_prefix(
        self,
        renderer: Renderer,
        instructions: str | None,
        tools: list[dict[str, Any]],
        key: tuple[Any, ...],
        response_format: dict[str, Any] | None = None,
    ) -> int:
        """Render new instructions, tools and output format in front of the kept item tokens.

        Only the prefix is tokenized; the items' tokens are reused. Returns tokens rendered.
        """
        prefix = renderer.render_prefix(instructions, tools, response_format)
        rendered = len(prefix)
        prefix.extend(self.tokens[self.prefix_len :])
        self.tokens = prefix
        self.prefix_len = rendered
        self.prefix_key = key
        return rendered


def common_prefix(a: TokenArray, b: TokenArray) -> int:
    """The length of the longest common prefix of two token arrays (C-speed slice compares)."""
    if a is b:
        return len(a)
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class ResponseCache:
    """Bounded map from response id to the conversation state after that response.

    Bounded by entry count and by approximate bytes; the least recently stored entry goes first.
    """

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[ConversationState, int]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._entries

    @property
    def bytes_used(self) -> int:
        """Approximate bytes held."""
        return self._bytes

    def take(self, response_id: str) -> ConversationState | None:
        """Remove and return the state after ``response_id``; None if not cached."""
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return None
        self._bytes -= entry[1]
        return entry[0]

    def put(self, response_id: str, state: ConversationState) -> int:
        """Keep ``state`` under ``response_id``, evicting the oldest entries over budget;
        returns how many were evicted (a state too large to keep counts as one)."""
        if self._max_entries <= 0:
            return 0
        size = state.approx_bytes()
        if size > self._max_bytes:
            return 1
        self.take(response_id)
        evictions = 0
        self._entries[response_id] = (state, size)
        self._bytes += size
        while len(self._entries) > self._max_entries or self._bytes > self._max_bytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._bytes -= evicted
            evictions += 1
        return evictions

    def entries(self) -> list[tuple[str, ConversationState]]:
        """(response id, state) of every entry, oldest first."""
        return [(rid, entry[0]) for rid, entry in self._entries.items()]

    def clear(self) -> None:
        """Drop everything (the stream ended)."""
        self._entries.clear()
        self._bytes = 0
