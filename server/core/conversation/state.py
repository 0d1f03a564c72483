"""Conversation state and the per-stream cache that keeps it between turns.

A ``ConversationState`` is everything the next turn can reuse: the items so far, their
rendered tokens, the call-id map and the pipeline stages' own carried state (the tools and
the route stay on the lane, ``core.runs.lane``). A continuation *takes* its predecessor's state out
of the cache and appends to it in place (so nothing is copied or rendered twice); on success
the new response's id owns it, and on failure it is dropped, which is why a failed
continuation evicts the response it referenced, exactly as the hosted WebSocket mode does.
"""

from __future__ import annotations

import copy
import sys
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from bidi_responses.schema import Item, JSONObject, ResponseObject

#: What a pipeline stage carries from turn to turn of a conversation: its own state, of its
#: own shape (the core only keeps it, under the stage's name, with the conversation).
CarriedState: TypeAlias = dict[str, Any]
#: The instructions, tools and canonical output format a prompt begins with.
Prefix: TypeAlias = tuple[str | None, list[JSONObject], JSONObject | None]


class PrefixRenderer(Protocol):
    """What ``set_prefix`` asks of a renderer (``rendering.render.Renderer``)."""

    def render_prefix(
        self,
        instructions: str | None,
        tools: list[JSONObject],
        response_format: JSONObject | None = None,
    ) -> array[int]:
        """The token ids of a prompt's instructions, tools and output format."""
        ...


class KeptRender(Protocol):
    """What a whole-conversation format keeps of its last render
    (``rendering.render.RenderMemo``); the state only counts the memory it holds."""

    def approx_bytes(self) -> int:
        """Memory held, for the caches' byte budgets."""
        ...


# The state object, its small containers, the last response's envelope, stage state.
_STATE_OVERHEAD = 8192


def object_bytes(value: object) -> int:
    """Bytes a JSON-shaped value holds in memory (dicts, lists, strings, numbers), counted
    once when an item joins a conversation so the caches bound real memory, not token counts."""
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        for key, inner in value.items():
            size += sys.getsizeof(key) + object_bytes(inner)
    elif isinstance(value, list | tuple):
        for inner in value:
            size += object_bytes(inner)
    return size


@dataclass(slots=True)
class ConversationState:
    """The reusable state of one conversation after its latest response."""

    tokens: array[int] = field(default_factory=lambda: array("I"))
    prefix_len: int = 0
    prefix_key: Prefix | None = None
    items: list[Item] = field(default_factory=list)
    call_names: dict[str, str] = field(default_factory=dict)
    answered_calls: set[str] = field(default_factory=set)
    model_turns: int = 0
    tool_rounds: int = 0
    # True while every response in the chain was written to the durable store, so a stored
    # continuation can point at its predecessor instead of carrying the whole history.
    stored_chain: bool = True
    # Unused (None): nothing reads the last response's snapshot, which held ~2 KB per idle
    # stream; the field stays so that handed-off states of every version decode alike.
    last_response: ResponseObject | None = None
    stage_state: dict[str, CarriedState] = field(default_factory=dict)
    # Bytes the items hold as Python objects (dicts, lists, strings), added as items join.
    item_bytes: int = 0
    # The chat format ``tokens`` are in (``Renderer.format_name``); a route with another
    # format renders the conversation again.
    format_name: str | None = None
    # A whole-conversation format's memo of its last render (``Renderer.render_whole``),
    # None when the next render starts afresh; with its size in bytes.
    render_memo: KeptRender | None = None

    def approx_bytes(self) -> int:
        """Memory held, for the caches' byte budgets: the token array as allocated, the items
        as Python objects, and a fixed allowance for the rest (maps, last response, stages)."""
        return (
            sys.getsizeof(self.tokens)
            + self.item_bytes
            + (self.render_memo.approx_bytes() if self.render_memo is not None else 0)
            + 8 * len(self.items)
            + 200 * (len(self.call_names) + len(self.answered_calls))
            + _STATE_OVERHEAD
        )

    def set_prefix(
        self,
        renderer: PrefixRenderer,
        instructions: str | None,
        tools: list[JSONObject],
        key: Prefix,
        response_format: JSONObject | None = None,
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


class MemoryBudget:
    """One byte budget over every stream's cache, with least-recently-used eviction.

    Each cache entry is charged here when stored and released when taken back, dropped or
    evicted. Storing an entry that takes the total over the budget evicts the least recently
    stored entries of any stream until it fits.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self.evictions = 0
        self._lru: OrderedDict[tuple[int, str], tuple[ResponseCache, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def charge(self, cache: ResponseCache, response_id: str, size: int) -> None:
        """Account a new entry, evicting others (least recently stored first) to fit it."""
        self._lru[(id(cache), response_id)] = (cache, size)
        self.used += size
        while self.used > self.max_bytes and self._lru:
            (_, victim_id), (victim, _) = next(iter(self._lru.items()))
            victim.drop(victim_id)
            self.evictions += 1

    def release(self, cache: ResponseCache, response_id: str) -> None:
        """An entry left its cache."""
        entry = self._lru.pop((id(cache), response_id), None)
        if entry is not None:
            self.used -= entry[1]

    def counters(self) -> dict[str, int]:
        """Budget, bytes held, entries and evictions, for the stats call."""
        return {
            "global_max_bytes": self.max_bytes,
            "bytes_used": self.used,
            "entries": len(self._lru),
            "evictions": self.evictions,
        }


class ResponseCache:
    """Bounded map from response id to the conversation state after that response: one per
    stream, serving every lane of it (so a create on one lane can fork another's response).

    Bounded by entry count per lane, by bytes per stream and (with a ``MemoryBudget``) across
    every stream; the least recently stored entry goes first.
    """

    def __init__(
        self, max_entries: int, max_bytes: int, budget: MemoryBudget | None = None
    ) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._budget = budget
        # response id -> (state, its bytes, the lane that owns it)
        self._entries: OrderedDict[str, tuple[ConversationState, int, str]] = OrderedDict()
        self._lane_counts: dict[str, int] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._entries

    @property
    def bytes_used(self) -> int:
        """Bytes held."""
        return self._bytes

    def take(self, response_id: str, lane: str | None = None) -> ConversationState | None:
        """The state after ``response_id``; None if not cached.

        On the lane that owns it (or with no lane given) the state moves out of the cache:
        the continuation extends it in place, and a failed one leaves nothing behind. On
        another lane it is a fork: the caller gets a copy and the entry stays for its lane.
        """
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        if lane is not None and entry[2] != lane:
            return fork_state(entry[0])
        del self._entries[response_id]
        self._bytes -= entry[1]
        self._lane_counts[entry[2]] -= 1
        if self._budget is not None:
            self._budget.release(self, response_id)
        return entry[0]

    def owned(self, response_id: str) -> ConversationState | None:
        """The state after ``response_id``, left in the cache (not to be changed); None if
        not cached."""
        entry = self._entries.get(response_id)
        return entry[0] if entry is not None else None

    def drop(self, response_id: str) -> None:
        """Forget an entry (evicted)."""
        self.take(response_id)

    def put(self, response_id: str, state: ConversationState, lane: str = "") -> int:
        """Keep ``state`` under ``response_id`` for ``lane``, evicting the lane's oldest
        entries past ``max_entries`` and the stream's oldest past ``max_bytes``; returns how
        many were evicted (a state too large to keep counts as one). Entries evicted by the
        global budget are counted there."""
        if self._max_entries <= 0:
            return 0
        self.take(response_id)
        size = state.approx_bytes()
        if size > self._max_bytes or (self._budget is not None and size > self._budget.max_bytes):
            return 1
        evictions = 0
        while self._lane_counts.get(lane, 0) >= self._max_entries:
            oldest = next(rid for rid, entry in self._entries.items() if entry[2] == lane)
            self.take(oldest)
            evictions += 1
        while self._entries and self._bytes + size > self._max_bytes:
            self.take(next(iter(self._entries)))
            evictions += 1
        self._entries[response_id] = (state, size, lane)
        self._lane_counts[lane] = self._lane_counts.get(lane, 0) + 1
        self._bytes += size
        if self._budget is not None:
            self._budget.charge(self, response_id, size)
        return evictions

    def entries(self) -> list[tuple[str, ConversationState]]:
        """(response id, state) of every entry, oldest first."""
        return [(rid, entry[0]) for rid, entry in self._entries.items()]

    def owned_entries(self) -> list[tuple[str, ConversationState, str]]:
        """(response id, state, owning lane) of every entry, oldest first."""
        return [(rid, entry[0], entry[2]) for rid, entry in self._entries.items()]

    def clear(self) -> None:
        """Drop everything (the stream ended)."""
        for response_id in list(self._entries):
            self.take(response_id)


def fork_state(state: ConversationState) -> ConversationState:
    """An independent copy of ``state`` for a fork (the items themselves are never changed
    once in a conversation, so the lists are copied, not the items)."""
    return ConversationState(
        tokens=array("I", state.tokens),
        prefix_len=state.prefix_len,
        prefix_key=state.prefix_key,
        items=list(state.items),
        call_names=dict(state.call_names),
        answered_calls=set(state.answered_calls),
        model_turns=state.model_turns,
        tool_rounds=state.tool_rounds,
        stored_chain=state.stored_chain,
        last_response=state.last_response,
        stage_state=copy.deepcopy(state.stage_state),
        item_bytes=state.item_bytes,
        format_name=state.format_name,
    )


def observe(state: ConversationState, item: Item) -> None:
    """Track model turns and tool rounds as items join the conversation."""
    is_model = _is_model(item)
    last = state.items[-1] if state.items else None
    last_is_model = last is not None and _is_model(last)
    if is_model and not last_is_model:
        state.model_turns += 1
    if item["type"] == "function_call" and (last is None or last["type"] != "function_call"):
        state.tool_rounds += 1
    elif item["type"] == "message" and item["role"] == "user":
        state.tool_rounds = 0
    if item["type"] == "function_call_output" or item["type"] == "custom_tool_call_output":
        state.answered_calls.add(item.get("call_id", ""))
    state.items.append(item)


def _is_model(item: Item) -> bool:
    """Whether the model wrote ``item`` (a call, reasoning or an assistant message)."""
    if item["type"] == "message":
        return item["role"] == "assistant"
    return item["type"] in ("function_call", "custom_tool_call", "reasoning")
