"""Two adaptations of uvicorn's sans-io WebSocket protocol, passed through its public ``ws=``
and logging settings.

The protocol subclass is the one override of uvicorn code this server keeps, because no
option covers it: uvicorn's ``websocket.close`` waits for the socket to become writable, so
closing a client that stopped reading (the write timeout) would hang that handler for as long
as the client stays silent.
"""

from __future__ import annotations

import logging
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

# After closing a stalled client, how long the close frame may wait for it before the socket
# is dropped.
STALLED_CLOSE_S = 10.0


class WebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, except that closing never waits for a client that
    stopped reading: the close frame joins the buffered data, and the socket is dropped if
    the client still reads nothing for a while."""

    # ``Any``: uvicorn types the message with its private ``_types`` module.
    async def send(self, message: Any) -> None:
        """Send an ASGI message; a close goes out at once even while writing is paused."""
        if (
            message["type"] == "websocket.close"
            and self.handshake_complete
            and not self.writable.is_set()
        ):
            self.writable.set()
            await super().send(message)
            self.loop.call_later(STALLED_CLOSE_S, self.transport.abort)
            return
        await super().send(message)


class _DenialLogFilter(logging.Filter):
    """uvicorn's sans-io WebSocket protocol sends a denial response (our 401/429/503 before the
    upgrade) correctly but then logs "returned without completing handshake" as if the app
    had failed; drop that one false alarm."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "without completing handshake" not in record.getMessage()


_DENIAL_FILTER = _DenialLogFilter()


def quiet_denial_logs() -> None:
    """Install the filter on uvicorn's error log (once)."""
    uvicorn_log = logging.getLogger("uvicorn.error")
    if _DENIAL_FILTER not in uvicorn_log.filters:
        uvicorn_log.addFilter(_DENIAL_FILTER)
