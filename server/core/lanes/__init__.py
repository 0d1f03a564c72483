"""A stream's conversations: the session (one per stream, its I/O) and the sans-I/O lane
machine that owns its lanes' rules (the order of their creates, steers, appends, injects and
cancels), with the outbound queue the transport reads."""

from .naming import StreamNaming

__all__ = ["StreamNaming"]
