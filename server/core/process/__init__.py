"""The process around the responses: what it has open (to know when it is idle), handing
memory back once it is, cleanup that a cancellation cannot cut short, and asyncio's queues and
events without their eager blocks (what an idle stream holds)."""

from .lean import LeanEvent, LeanQueue, SmallDeque
from .uncancelled import uncancelled

__all__ = ["LeanEvent", "LeanQueue", "SmallDeque", "uncancelled"]
