"""The HTTP listener's socket: every accepted connection accounted for, and ``accept()`` that
never spins when the process is out of descriptors.

asyncio (3.11/3.12) answers EMFILE/ENFILE from ``accept()`` by logging an ERROR with a
traceback and retrying a second later, once per try of its accept loop (up to the backlog,
2048) and once more per scheduled retry: a descriptor flood wrote 686,000 such lines in 90 s.
This socket does what libuv and nginx do instead: it keeps one spare descriptor, and when
``accept()`` fails for want of one it frees the spare, accepts the waiting connection, tells
it why if it can (plaintext: a 503), closes it and takes the spare again. The kernel's queue
is drained, nothing spins, and the line saying so is rate-limited.

Accepted connections are counted in a ``ConnectionAccount`` (``server/transports/
connections.py``) from ``accept()`` to ``close()``, so the count is of descriptors really
held, whatever state the connection is in (a TLS handshake, an idle keep-alive, WebSocket).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

from ...core.api import ApiError
from ...core.observability import CLIENT_FAULTS, Metrics
from ..connections import ConnectionAccount

log = logging.getLogger("bidi_responses.http")

_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\nretry-after: 1\r\n"
    b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
)
_BUSY_BODY = (
    b'{"error":{"message":"The server is out of descriptors for new connections; retry '
    b'shortly.","type":"server_error","param":null,"code":"too_many_connections"}}'
)
#: How long a refused connection may stay open without sending its request.
REFUSAL_GRACE_S = 5.0


class CountedSocket(socket.socket):
    """An accepted connection that gives its slot back when it is closed."""

    _released: Callable[[], None] | None = None

    def close(self) -> None:
        released, self._released = self._released, None
        if released is not None:
            released()
        super().close()


class GuardedListener(socket.socket):
    """A listening socket whose ``accept()`` accounts for connections and sheds load when
    the process is out of descriptors (see the module's docstring)."""

    account: ConnectionAccount
    metrics: Metrics
    #: Plaintext (no TLS): a connection shed for want of descriptors can be sent a 503.
    plaintext: bool = True
    #: Called with a refused connection's socket (to close it if it stays silent).
    on_refused: Callable[[socket.socket], None] | None = None
    _spare: int | None = None

    @classmethod
    def wrap(
        cls, sock: socket.socket, account: ConnectionAccount, metrics: Metrics, *, tls: bool
    ) -> GuardedListener:
        """``sock`` (bound, listening) as a guarded listener; ``sock`` is detached."""
        guarded = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        guarded.account = account
        guarded.metrics = metrics
        guarded.plaintext = not tls
        guarded._take_spare()
        return guarded

    def close(self) -> None:
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
        super().close()

    def accept(self) -> tuple[socket.socket, Any]:
        while True:
            try:
                fd, address = self._accept()  # type: ignore[attr-defined]
            except OSError as error:
                if error.errno not in _OUT_OF_DESCRIPTORS:
                    raise
                if not self._shed_one(error):
                    # No spare to shed with: report "nothing to accept" rather than an error
                    # asyncio would log at every try.
                    raise BlockingIOError(errno.EAGAIN, "out of descriptors") from None
                continue
            conn = CountedSocket(self.family, self.type, self.proto, fileno=fd)
            host, port = str(address[0]), int(address[1])
            verdict = self.account.admit(host, port)
            if verdict is False:
                self._refused("refusing")
                conn.close()
                continue
            conn._released = functools.partial(self._release, host, port)
            self.metrics.open_connections.labels("http").set(self.account.open)
            if isinstance(verdict, ApiError):
                reason = "peer" if verdict.status == 429 else "server"
                self._refused(reason)
                if self.on_refused is not None:
                    self.on_refused(conn)
            return conn, address

    def _release(self, host: str, port: int) -> None:
        self.account.release(host, port)
        self.metrics.open_connections.labels("http").set(self.account.open)

    def _refused(self, reason: str) -> None:
        self.metrics.connections_refused.labels("http", reason).inc()
        CLIENT_FAULTS.log(
            log,
            logging.WARNING,
            f"http-connection-{reason}",
            "HTTP connection refused: %s",
            {
                "peer": "too many from one address (limits.max_connections_per_peer)",
                "server": "the listener is full (limits.max_connections)",
                "refusing": "too many refusals pending; closed at once",
            }[reason],
        )

    def _take_spare(self) -> None:
        try:
            self._spare = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._spare = None

    def _shed_one(self, error: OSError) -> bool:
        """Out of descriptors: drop one waiting connection using the spare descriptor.
        False if there is no spare (another thread took the descriptor it freed)."""
        if self._spare is None:
            self._take_spare()
            if self._spare is None:
                return False
        os.close(self._spare)
        self._spare = None
        try:
            fd, _ = self._accept()  # type: ignore[attr-defined]
        except BlockingIOError:
            self._take_spare()
            raise
        except OSError:
            self._take_spare()
            return False
        try:
            if self.plaintext:
                body = _BUSY_BODY
                os.write(fd, _BUSY % (len(body), body))
        except OSError:
            pass  # best effort: the client learns from the close
        finally:
            os.close(fd)
            self._take_spare()
        self.metrics.connections_refused.labels("http", "descriptors").inc()
        CLIENT_FAULTS.log(
            log,
            logging.ERROR,
            "accept-out-of-descriptors",
            "out of descriptors (%s): a new HTTP connection was refused; "
            "lower limits.max_connections or raise RLIMIT_NOFILE",
            os.strerror(error.errno or 0),
        )
        return True
