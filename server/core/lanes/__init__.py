"""A stream's conversations: the session (one per stream) and its lanes, the sans-I/O lane
machine that orders their creates and steers, the per-stream cache, and what a continuation
resumes from."""

from .naming import StreamNaming

__all__ = ["StreamNaming"]
