"""Recent states: the rendered state after each stored response this process made without a
stream, for a continuation that arrives without that state in a stream cache.

An HTTP ``previous_response_id`` turn (or gRPC ``CreateResponse``, a background response, the
first turn of a new stream) would otherwise rebuild the whole conversation from the store,
checking and rendering every item again, so its cost grows with the conversation. Here it
takes the state its predecessor left, as a stream's continuation does, and renders only its
new input.

Only ``store: true`` responses are kept: what is served from here is what the store would
give, so the hosted rule that a ``store: false`` response is reachable from its own connection
only holds. A state is served only to the tenant that made it, and only while the store still
shows that response to that tenant (``continuation.resolve`` asks it first: a deleted response
is never continued from memory, on any replica). A state *moves* out on its first
continuation (a second one at the same time rebuilds from the store), so no two runs share a
mutable state. Entries are bounded like a stream's cache: by count, by bytes, and by the one
budget over every cache (``MemoryBudget``), least recently kept first.
"""

from __future__ import annotations

from .state import ConversationState, MemoryBudget, ResponseCache


class RecentStates(ResponseCache):
    """The process-wide cache of recent stored responses' states, keyed by response id and
    owned by a tenant (None on an open server)."""

    def __init__(self, max_entries: int, max_bytes: int, budget: MemoryBudget) -> None:
        super().__init__(max_entries, max_bytes, budget)
        self._owners: dict[str, str | None] = {}

    def keep(self, tenant: str | None, response_id: str, state: ConversationState) -> int:
        """Keep the state after stored response ``response_id`` of ``tenant``; returns how
        many entries were evicted to fit it."""
        # The response is stored, so a continuation's stored form may point at it (as one
        # rebuilt from the store would) rather than carry the whole conversation.
        state.stored_chain = True
        evicted = self.put(response_id, state)
        if response_id in self:
            self._owners[response_id] = tenant
        return evicted

    def held(self, tenant: str | None, response_id: str) -> ConversationState | None:
        """The state after ``response_id`` if ``tenant`` owns it, left in place (to look at
        before taking it)."""
        if response_id not in self._owners or self._owners[response_id] != tenant:
            return None
        return self.owned(response_id)

    def take_for(self, tenant: str | None, response_id: str) -> ConversationState | None:
        """Move out the state after ``response_id`` if ``tenant`` owns it; None otherwise
        (another tenant's entry stays where it is)."""
        if response_id not in self._owners or self._owners[response_id] != tenant:
            return None
        return self.take(response_id)

    def take(self, response_id: str, lane: str | None = None) -> ConversationState | None:
        """``ResponseCache.take``; every way out (taken, evicted, replaced) passes here."""
        self._owners.pop(response_id, None)
        return super().take(response_id, lane)
