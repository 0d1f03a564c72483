"""The process around the responses: what it has open (to know when it is idle), handing
memory back once it is, and cleanup that a cancellation cannot cut short."""

from .uncancelled import uncancelled

__all__ = ["uncancelled"]
