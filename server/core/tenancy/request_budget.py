"""One server-wide budget on request bytes being read or held before they are parsed.

Each transport bounds a single message (``limits.max_message_bytes``); this bounds them all at
once, across every transport and stream: HTTP bodies are charged as they are read (a declared
``Content-Length`` up front), gRPC messages and WebSocket frames from the moment the transport
hands them over until they are decoded. Past the budget a message is refused with a retryable
429 / RESOURCE_EXHAUSTED that says it is the server-wide budget, not the client's own limit.
A transport charges a message as many times as it holds copies of it at once
(``TransportNaming``, given to each transport by the composition root).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..api.errors import ApiError


class RequestBytes:
    """Bytes of requests held server-wide (``limit`` 0: no budget). Event-loop only."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0
        self.refused = 0

    def take(self, size: int) -> None:
        """Charge ``size`` bytes; ApiError 429 (nothing charged) if that passes the budget."""
        if self.limit and self.held + size > self.limit:
            self.refused += 1
            raise over_budget(self.limit, size)
        self.held += size
        self.peak = max(self.peak, self.held)

    def release(self, size: int) -> None:
        """Give back bytes charged by ``take``."""
        self.held = max(self.held - size, 0)

    @contextlib.contextmanager
    def holding(self, size: int) -> Iterator[None]:
        """Charge ``size`` bytes while the block runs."""
        self.take(size)
        try:
            yield
        finally:
            self.release(size)


def over_budget(limit: int, size: int) -> ApiError:
    """The retryable 429 for a message the server-wide budget cannot take now."""
    return ApiError(
        f"The server is busy reading other requests: this message ({size} bytes) would pass "
        f"the server-wide budget on request bytes being read at once ({limit} bytes, "
        "limits.max_inflight_request_bytes). This is not a limit on your request; retry "
        "shortly.",
        code="server_busy",
        status=429,
        type="server_error",
        metadata={
            "limit": "max_inflight_request_bytes",
            "limit_value": str(limit),
            "retry_after_s": "1",
        },
    )
