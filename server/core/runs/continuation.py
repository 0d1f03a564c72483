"""What a response continues from: the cached, handed-off or stored predecessor.

``resolve`` finds the base of a continuation, cheapest first: the lane's cache (the state moves
out of it, so a failed turn leaves nothing behind), the state this process kept for a stored
response made without a stream (``recent.py``) or that a draining replica handed off
(``handoff.py``), then the durable store's chain, whose items are checked and rendered again.
``sync_prefix`` renders the instructions, tools and output format in front of the kept item
tokens when they changed; ``hand_off`` leaves a state for the next replica.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from bidi_responses.schema import Item, JSONObject

from ..api.jsonshape import plain_numbers
from ..api.params import response_format
from ..api.requests import CreateRequest
from ..conversation.state import (
    ConversationState,
    Prefix,
    object_bytes,
    observe,
)
from ..rendering.render import (
    Renderer,
    TokenArray,
    common_prefix,
    note_call,
)
from ..storage.handoff import decode_state, encode_state
from ..storage.history import stored_history
from .deps import RunDeps
from .lane import Lane


@dataclass(slots=True)
class Base:
    """The state a response starts from, and what ``cached_tokens`` is measured against."""

    state: ConversationState = field(default_factory=ConversationState)
    # Items of a stored chain, to check and render again (empty with a live state).
    history: list[Item] = field(default_factory=list)
    # A live predecessor's whole context (prompt and output) as tokens.
    previous_tokens: TokenArray | None = None
    # A stored predecessor's prompt prefix.
    previous_prefix: Prefix | None = None


async def resolve(
    deps: RunDeps,
    lane: Lane,
    tenant: str | None,
    previous: str | None,
    declared: frozenset[str] = frozenset(),
) -> Base:
    """The base of a response continuing ``previous`` (a fresh one when it is None), for a
    request declaring the functions ``declared``."""
    if previous is None:
        return Base()
    # The stream's cache serves every lane: another lane's response is a fork (a copy).
    state = lane.cache.take(previous, lane.id) if lane.cache is not None else None
    if state is None and (previous in deps.recent or deps.state_tier is not None):
        state = await _restore(deps, tenant, previous, declared)
    if state is not None:
        deps.metrics.cache_hits.inc()
        return Base(state, previous_tokens=state.tokens)
    deps.metrics.cache_misses.inc()
    # Stored items are checked again like any other input: this request has no cache.
    history, last = await stored_history(deps.store, deps.config.limits, previous, tenant)
    text = last.get("text")
    fmt = response_format(text) if isinstance(text, dict) else None
    prefix = (
        last.get("instructions"),
        list(last.get("tools") or ()),
        plain_numbers(fmt) if fmt is not None else None,
    )
    return Base(history=history, previous_prefix=prefix)


async def _restore(
    deps: RunDeps, tenant: str | None, previous: str, declared: frozenset[str]
) -> ConversationState | None:
    """The state this process kept for stored response ``previous`` (recent.py) or a
    draining replica left for it (handoff.py), or None."""
    try:
        # Only the owner's own conversation, and only while it is stored: another tenant's
        # id, or a response deleted (here or on another replica), is rebuilt from the store,
        # which refuses it.
        if await deps.store.get(previous, tenant) is None:
            return None
        held = deps.recent.held(tenant, previous)
        if held is not None:
            if not _history_accepted(deps, held, declared):
                return None  # the store's rebuild gives this request its answer
            # Moved out, so a continuation at the same time rebuilds from the store instead.
            return deps.recent.take_for(tenant, previous)
        if deps.state_tier is None:
            return None
        blob = await deps.state_tier.take_state(previous)
        if blob is None:
            return None
        state = decode_state(blob)
    except Exception:  # unreadable or unreachable: rebuild from the stored chain
        deps.log.exception("conversation state of %s not restored", previous)
        return None
    deps.state.failover["states_restored"] += 1
    return state


def _history_accepted(deps: RunDeps, state: ConversationState, declared: frozenset[str]) -> bool:
    """Whether a rebuild from the store would take ``state``'s items as this request's
    history: a request served from memory is then answered as one rebuilt would be, so
    whether the process still holds the state never changes the answer.

    The rebuild checks the history again as input: its size, and (the ``validation`` stage)
    that every function it calls is declared now. Each item passed the rest of its checks
    when it joined the conversation, in this process (a compaction item's seal, with this
    process's key, among them).
    """
    limits = deps.config.limits
    # item_bytes counts each string's object size, never below its characters.
    if len(state.items) > limits.max_input_items or state.item_bytes > limits.max_request_chars:
        return False
    if not declared or "validation" not in deps.pipeline.names:
        return True
    if declared.issuperset(state.call_names.values()):
        return True  # the usual case, without walking the history
    # Custom tool calls are named in the map too, and are not checked by name.
    return all(item["name"] in declared for item in state.items if item["type"] == "function_call")


async def hand_off(deps: RunDeps, response_id: str, state: ConversationState) -> None:
    """The server is draining: leave this conversation's state for the replica that gets
    its next turn, before the terminal event lets the client move (handoff.py). A response
    made without a stream leaves it too: its client's next turn (HTTP) goes elsewhere."""
    if state.stored_chain:
        await save_states(deps, [(response_id, state)])


async def save_states(deps: RunDeps, states: list[tuple[str, ConversationState]]) -> None:
    """Leave ``(response id, state)`` pairs in the shared tier (none without one); a state
    that cannot be left there is re-rendered from the store by the next replica."""
    tier = deps.state_tier
    if tier is None or not states:
        return
    try:
        blobs = [(response_id, encode_state(state)) for response_id, state in states]
        await tier.save_states(blobs, deps.config.store.state_ttl_s)
    except Exception:
        deps.log.exception("could not hand off %d conversation states", len(states))
    else:
        deps.state.failover["states_handed_off"] += len(states)


def sync_prefix(
    state: ConversationState,
    renderer: Renderer,
    request: CreateRequest,
    fmt: JSONObject | None,
) -> int:
    """Bring the state's tokens to ``renderer``'s format and the request's prefix; returns
    the tokens rendered (none when nothing changed)."""
    rendered = 0
    if renderer.whole_conversation:
        # A chat template renders the conversation whole, when the items join
        # (``render_whole``); a new format or prefix starts its render afresh.
        wanted: Prefix = (request.instructions, request.tools, fmt)
        if state.format_name != renderer.format_name or state.prefix_key != wanted:
            state.render_memo = None
        state.format_name = renderer.format_name
        state.prefix_key = wanted
        state.prefix_len = 0
        return 0
    if state.format_name is not None and state.format_name != renderer.format_name:
        # The conversation moved to a model of another format: render its items again; the
        # prefix follows below, as for any changed prefix.
        state.tokens = array("I")
        state.prefix_len = 0
        state.prefix_key = None
        state.render_memo = None
        rendered += renderer.render_items(state.items, {}, state.tokens)
    state.format_name = renderer.format_name
    key = state.prefix_key
    if (
        key is None
        or key[0] != request.instructions
        or (key[1] is not request.tools and key[1] != request.tools)
        or key[2] != fmt
    ):
        rendered += state.set_prefix(
            renderer,
            request.instructions,
            request.tools,
            (request.instructions, request.tools, fmt),
            fmt,
        )
    return rendered


def render_whole(
    deps: RunDeps, renderer: Renderer, state: ConversationState, items: list[Item]
) -> int:
    """Add ``items`` to a conversation whose format renders it whole (a model's chat
    template) and render it again; returns the tokens tokenized anew.

    The state's token array is replaced, never changed in place, so a predecessor's tokens
    stay what the backend saw. When the previous tokens are not a prefix of the new ones
    (the template renders earlier turns differently now) the break is counted; the caller
    measures the tokens the two renders share for ``cached_tokens``.
    """
    for item in items:
        note_call(item, state.call_names)
        observe(state, item)
        state.item_bytes += object_bytes(item)
    instructions, tools = (
        (state.prefix_key[0], state.prefix_key[1])
        if state.prefix_key
        else (
            None,
            [],
        )
    )
    previous = state.tokens
    continued = state.render_memo is not None
    tokens, memo, tokenized = renderer.render_whole(
        instructions, tools, state.items, state.render_memo
    )
    if continued and common_prefix(previous, tokens) < len(previous):
        deps.note_prompt_rerender(renderer.format_name)
    state.tokens = tokens
    state.render_memo = memo
    return tokenized


def stored_reuse(
    renderer: Renderer, state: ConversationState, previous_prefix: Prefix, history_tokens: int
) -> int:
    """Tokens this prompt shares with a stored predecessor's context (prefix + history)."""
    if renderer.whole_conversation:
        instructions, tools, _ = previous_prefix
        old, _, _ = renderer.render_whole(instructions, tools, state.items, None)
        return common_prefix(old, state.tokens)
    shared = state.prefix_len + history_tokens
    old_prefix = renderer.render_prefix(*previous_prefix)
    if old_prefix == state.tokens[: state.prefix_len]:
        return shared
    old_prefix.extend(state.tokens[state.prefix_len : shared])
    return common_prefix(old_prefix, state.tokens[:shared])
