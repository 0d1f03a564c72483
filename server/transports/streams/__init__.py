"""One stream driver for every streaming transport, over a small wire interface.

``driver.py`` runs a stream (admission, the reader, the writer, the end status, cleanup) over a
``Wire`` (``wire.py``) that each transport implements as a short adapter translating framing;
``writes.py`` is the one write-timeout mechanism, which SSE uses as well.
"""

from .driver import StreamDriver, open_stream
from .wire import Incoming, Refusal, Wire
from .writes import (
    WatchedWrites,
    WriteWatch,
    write_timeout_error,
)

__all__ = [
    "Incoming",
    "Refusal",
    "StreamDriver",
    "WatchedWrites",
    "Wire",
    "WriteWatch",
    "open_stream",
    "write_timeout_error",
]
