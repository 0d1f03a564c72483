"""grpc.aio's ERROR for a reply the client would not take, logged as what it is.

When a client goes away or refuses a message (a stock client refuses any over 4 MiB) while
grpc.aio sends a unary reply or a final status, grpc.aio fails the send and, unless it has
already seen the client's cancel, logs ``ExecuteBatchError raised in core by servicer method``
at ERROR with a traceback. Nothing failed on the server's side: the client ended the call.
The record is kept at DEBUG on the project's gRPC logger, so an operator's ERROR lines stay
the server's own faults, and a client cannot fill the log with them.
"""

from __future__ import annotations

import logging

_GRPC_LOGGER = "grpc._cython.cygrpc"
_CLIENT_GONE = "ExecuteBatchError raised in core by servicer method"

log = logging.getLogger("bidi_responses.grpc")


class ClientGoneFilter(logging.Filter):
    """Moves grpc.aio's failed-send ERROR records to DEBUG on ``bidi_responses.grpc``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(_CLIENT_GONE):
            log.debug("a reply was not sent, the client had gone: %s", record.getMessage())
            return False
        return True


def quiet_client_gone_sends() -> None:
    """Install the filter once on grpc.aio's logger."""
    logger = logging.getLogger(_GRPC_LOGGER)
    if not any(isinstance(f, ClientGoneFilter) for f in logger.filters):
        logger.addFilter(ClientGoneFilter())
