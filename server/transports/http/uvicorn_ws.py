"""Adaptations of uvicorn's sans-io WebSocket protocol, passed through its public ``ws=`` and
logging settings.

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


class _ClientFaultLogFilter(logging.Filter):
    """uvicorn answers a text frame of invalid UTF-8 correctly (close 1007) but logs it as an
    ERROR with a traceback. It is the client's fault, and an expected end of its connection:
    logged at INFO, in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.getMessage().startswith(
            "Invalid UTF-8 sequence received from client"
        ):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg = "WebSocket: a client sent a text frame of invalid UTF-8; closed (1007)"
            record.args = ()
            record.exc_info = record.exc_text = None
        return True


_DENIAL_FILTER = _DenialLogFilter()
_CLIENT_FAULT_FILTER = _ClientFaultLogFilter()


def quiet_denial_logs() -> None:
    """Install the filters on uvicorn's error log (once)."""
    uvicorn_log = logging.getLogger("uvicorn.error")
    for log_filter in (_DENIAL_FILTER, _CLIENT_FAULT_FILTER):
        if log_filter not in uvicorn_log.filters:
            uvicorn_log.addFilter(log_filter)
