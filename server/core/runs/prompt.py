"""A run's prompt: the conversation state it renders onto, in its route's format.

Every item that joins the conversation (the create's history and input, an append's tool
outputs, the engine's own output) is checked first (compaction seals, the pipeline's stages)
and then rendered onto the state's tokens. ``build`` does it for a create over the base its
continuation resolved, and measures what the cached context already had (``cached_tokens``).
"""

from __future__ import annotations

from bidi_responses.schema import Item, JSONObject

from ..api.ids import assign_ids
from ..conversation.state import ConversationState, object_bytes, observe
from ..ports import StageInput
from ..rendering.render import Renderer, common_prefix
from . import continuation
from .account import RunAccount
from .deps import RunDeps
from .offload import item_chars, offload
from .record import ResponseRecord


class Prompt:
    """The conversation ``state`` of one response, rendered by ``renderer``."""

    def __init__(
        self,
        deps: RunDeps,
        record: ResponseRecord,
        account: RunAccount,
        state: ConversationState,
        renderer: Renderer,
    ) -> None:
        self.deps = deps
        self.record = record
        self.account = account
        self.state = state
        self.renderer = renderer

    async def build(
        self,
        base: continuation.Base,
        size: int,
        steering: list[Item],
        output_format: JSONObject | None,
    ) -> None:
        """Pre-inference: bring the prefix up to date, then check and render the base's
        history and the new input (``steering`` first); ``size``: the characters to render,
        which decides whether the work leaves the event loop."""
        request = self.record.request
        stats = self.record.stats
        state = self.state
        history = base.history
        reused = 0
        limits = self.deps.config.limits
        rendered = await offload(
            size,
            limits,
            continuation.sync_prefix,
            state,
            self.renderer,
            request,
            output_format,
        )

        new_input = steering + request.input if steering else request.input
        assign_ids(new_input)
        items = history + new_input if history else new_input
        paths = [f"history[{i}]" for i in range(len(history))]
        paths += [f"steering[{i}]" for i in range(len(steering))]
        paths += [f"input[{i}]" for i in range(len(request.input))]
        stats.items_validated = len(items)
        await self.examine(items, paths)
        if base.previous_tokens is not None:
            # Taken after the prefix is rebuilt: changed instructions or tools reuse only the
            # tokens the old and new prompts still share.
            stats.tokens_reused = len(state.tokens) - rendered  # kept without rendering
            reused = common_prefix(base.previous_tokens, state.tokens)
        history_rendered = await offload(size, limits, self.render, history) if history else 0
        if base.previous_prefix is not None:
            reused = continuation.stored_reuse(
                self.renderer, state, base.previous_prefix, history_rendered
            )
        before = state.tokens
        rendered += history_rendered + await offload(size, limits, self.render, new_input)
        if self.renderer.whole_conversation:
            # A chat template may render earlier turns anew once new ones join.
            previous = base.previous_tokens
            shared = common_prefix(previous if previous is not None else before, state.tokens)
            reused = shared if previous is not None else min(reused, shared)
            if previous is not None:
                stats.tokens_reused = len(state.tokens) - rendered
        stats.tokens_rendered += rendered
        self.account.took_input(new_input, reused)

    async def examine(self, items: list[Item], paths: list[str]) -> None:
        """Check items before they join (``paths`` name them in errors); ApiError if one
        is refused."""
        request = self.record.request
        for item, path in zip(items, paths, strict=True):
            if item["type"] == "compaction":
                self.deps.compaction.check(item, path)
        declared = request.toolset.function_names
        batch = StageInput(
            items, paths, request, declared, self.state.call_names, self.state.answered_calls
        )
        counters = self.account.counters
        flags = await self.deps.pipeline.run(batch, self.state.stage_state, counters)
        self.record.safety_flags.extend(flag.to_dict() for flag in flags)
        self.record.stats.stage_items = counters.items
        self.record.stats.stage_ms = counters.ms

    def render(self, items: list[Item]) -> int:
        """Render items onto the conversation's tokens and record them; returns tokens added."""
        state = self.state
        if self.renderer.whole_conversation:
            return continuation.render_whole(self.deps, self.renderer, state, items)
        added = self.renderer.render_items(items, state.call_names, state.tokens)
        for item in items:
            observe(state, item)
            state.item_bytes += object_bytes(item)
        return added

    async def add_append(self, items: list[Item]) -> None:
        """Render an examined append's items, counting the tokens kept from before."""
        self.record.stats.items_validated += len(items)
        previous = self.state.tokens
        reused = len(previous)
        limits = self.deps.config.limits
        added = await offload(item_chars(items), limits, self.render, items)
        self.record.stats.tokens_rendered += added
        if self.renderer.whole_conversation:  # a new array: was the old one kept?
            reused = common_prefix(previous, self.state.tokens)
        self.account.took_input(items, reused)

    async def add_output(self, items: list[Item]) -> None:
        """Render the items an engine segment produced."""
        limits = self.deps.config.limits
        self.record.stats.tokens_rendered += await offload(
            item_chars(items), limits, self.render, items
        )
