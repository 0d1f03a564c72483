"""A conversation's reusable state and the caches that keep it between turns."""

from .recent import RecentStates
from .state import CarriedState, ConversationState, MemoryBudget, ResponseCache

__all__ = [
    "CarriedState",
    "ConversationState",
    "MemoryBudget",
    "RecentStates",
    "ResponseCache",
]
