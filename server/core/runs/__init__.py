"""One response from request to terminal event: the runner, what it counts, how it streams an
engine's output, and what it leaves behind (record, outcome, background runs)."""

from .record import TERMINAL_TYPES, OutEvent, answers_to, error_event

__all__ = ["TERMINAL_TYPES", "OutEvent", "answers_to", "error_event"]
