"""Adaptations of uvicorn's sans-io WebSocket protocol, passed through its public ``ws=``
and logging settings.

The protocol subclass is the one override of uvicorn code this server keeps, because no
option covers what it does: uvicorn's ``websocket.close`` waits for the socket to become
writable, so closing a client that stopped reading (the write timeout) would hang that handler
for as long as the client stays silent; and the bytes of a frame being read count against the
server-wide request budget (``server/core/tenancy/request_budget.py``) from the moment they
arrive, which only the protocol sees; so do the bytes a compressed message inflates to
(``limits.websocket_compression``), which only the protocol's extensions see. It also offers
the application ``send_texts``, which writes the frames of the events that are ready together
in one socket write: ASGI has one ``websocket.send`` per frame, a system call each.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar

from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import PayloadTooBig
from websockets.extensions.base import Extension
from websockets.frames import Frame
from websockets.http11 import Request
from websockets.protocol import Protocol, State

from ...core.api import ApiError
from ...core.process import LeanEvent, LeanQueue, SmallDeque
from ...core.tenancy import RequestBytes

# After closing a stalled client, how long the close frame may wait for it before the socket
# is dropped.
STALLED_CLOSE_S = 10.0
# After refusing a message, how long the rest of it is read and dropped before the close.
REFUSED_LINGER_S = 1.0
# The close that refuses a frame the server-wide budget cannot take: 1013, "try again later".
OVER_BUDGET_CLOSE = 1013
OVER_BUDGET_REASON = "server busy: server-wide request byte budget full; retry"
#: The ASGI scope extension through which the application sends text frames in bulk
#: (``WebSocketProtocol.send_texts``): ``scope["extensions"][SEND_TEXTS]["send"]``.
SEND_TEXTS = "bidi_responses.websocket.send_texts"

SendTexts = Callable[[Sequence[bytes]], Awaitable[None]]


def send_texts_of(scope: Any) -> SendTexts:
    """The connection's bulk text sender (WebSocket mode is served by ``WebSocketProtocol``
    only: ``server.start_http_server`` installs it)."""
    send: SendTexts = scope["extensions"][SEND_TEXTS]["send"]
    return send


class _ChargedInflate(Extension):
    """permessage-deflate whose inflated bytes are charged to the server-wide budget as they
    are produced, and which never inflates past what the budget has room for: the output of
    each frame is bounded before zlib produces it, so a message that compresses a
    thousandfold (63 MiB in 64 KB) costs the server what it would cost uncompressed."""

    def __init__(self, inner: Extension, protocol: WebSocketProtocol) -> None:
        self.inner = inner
        self.name = inner.name
        self.protocol = protocol

    def decode(self, frame: Frame, *, max_size: int | None = None) -> Frame:
        protocol = self.protocol
        budget = protocol.budget
        if budget is None or not budget.limit:
            return self.inner.decode(frame, max_size=max_size)
        room = max(budget.limit - budget.held, 0) // protocol.copies
        bound = room if max_size is None else min(max_size, room)
        try:
            decoded = self.inner.decode(frame, max_size=bound)
        except PayloadTooBig:
            if max_size is not None and bound >= max_size:
                raise  # the message limit itself (close 1009)
            protocol.refuse_while_inflating()
            raise
        extra = (len(decoded.data) - len(frame.data)) * protocol.copies
        if extra > 0:
            try:
                budget.take(extra)
            except ApiError:
                protocol.refuse_while_inflating()
                raise PayloadTooBig(None, bound) from None
            protocol._reading += extra
        return decoded

    def encode(self, frame: Frame) -> Frame:
        return self.inner.encode(frame)


class WebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, except that closing never waits for a client that
    stopped reading: the close frame joins the buffered data, and the socket is dropped if
    the client still reads nothing for a while; and bytes of a message being read are charged
    to ``budget`` until the message is handed to the application (which then charges it until
    the session takes it). A frame the budget cannot take closes the connection with 1013."""

    #: The server-wide budget (``bound_to`` sets it; None: no budget).
    budget: ClassVar[RequestBytes | None] = None
    #: Copies of a message held at once while it is read and decoded: charged that many
    #: times its bytes (``bound_to`` sets it).
    copies: ClassVar[int] = 1
    #: Bytes of the message being read, charged to ``budget``.
    _reading = 0
    #: A message was refused: what else arrives is dropped until the connection ends.
    _refused = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # uvicorn's inbox and write wake-up, without a deque's eager block each: an idle
        # connection holds them for its whole life (``core.process.lean``).
        self.queue = LeanQueue()
        self.writable = LeanEvent()
        self.writable.set()
        #: Charges of the messages queued for the application, oldest first.
        self._queued_charges: SmallDeque[int] = SmallDeque()

    @classmethod
    def bound_to(cls, budget: RequestBytes, copies: int) -> type[WebSocketProtocol]:
        """This protocol, charging ``budget`` ``copies`` times the bytes it reads (a subclass,
        since uvicorn takes a class)."""
        return type("BudgetedWebSocketProtocol", (cls,), {"budget": budget, "copies": copies})

    def data_received(self, data: bytes) -> None:
        """Charge the bytes of a message being read; refuse it past the budget."""
        if self._refused:
            return  # the rest of a refused message: dropped while the client reads the close
        budget = self.budget
        if budget is not None and self.handshake_complete and not self.close_sent:
            try:
                budget.take(len(data) * self.copies)
            except ApiError:
                self._refuse_over_budget()
                return
            self._reading += len(data) * self.copies
        super().data_received(data)

    def handle_connect(self, event: Request) -> None:
        """Accept the upgrade; a negotiated permessage-deflate is charged as it inflates.

        The application finds ``send_texts`` in its scope (``SEND_TEXTS``), put there before
        its task first runs (a wrapper around that task would keep a frame per connection).
        """
        super().handle_connect(event)
        if self.conn.extensions:
            self.conn.extensions = [_ChargedInflate(ext, self) for ext in self.conn.extensions]
        if self.response.status_code == 101:
            extensions: dict[str, Any] = self.scope["extensions"]
            extensions[SEND_TEXTS] = {"send": self.send_texts}

    def refuse_while_inflating(self) -> None:
        """A compressed message would inflate past the budget: the close (1013, saying why)
        goes out before the parser fails the connection, which then sends no other."""
        self._release_reading()
        if self.budget is not None:
            self.budget.refused += 1
        self.conn.send_close(OVER_BUDGET_CLOSE, OVER_BUDGET_REASON)

    def handle_parser_exception(self) -> None:
        """A message refused for its size (1009, past the message limit; 1013, past the
        budget while inflating) ends like a refusal while reading (``_refuse_over_budget``):
        the close goes out and reading goes on, dropping what comes, so a client still
        sending the rest of its message reads the close instead of a reset."""
        close = self.conn.close_sent
        if not isinstance(self.conn.parser_exc, PayloadTooBig) or close is None:
            super().handle_parser_exception()
            return
        self._release_reading()
        self.frames = []
        code, reason = close.code, close.reason
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self._refused = True
        self._linger_then_close()

    def _linger_then_close(self) -> None:
        """After a refusal, read and drop for a moment before closing: uvicorn closes the
        socket as soon as the application returns, and a client still sending the rest of
        its message then gets a reset that can discard the close frame it has not read yet.
        (A pending ``close_timer`` is what keeps uvicorn from closing it.)"""

        def close() -> None:
            self.transport.close()
            self.loop.call_later(STALLED_CLOSE_S, self.transport.abort)

        self.close_timer = self.loop.call_later(REFUSED_LINGER_S, close)

    def send_receive_event_to_app(self) -> None:
        """A whole message is queued for the application: its charge stays until the
        application takes it (``receive``), which then charges it itself. Released here, a
        queued message would be held uncharged while others are read (16 compressed 63 MiB
        messages then all inflated at once)."""
        charge, self._reading = self._reading, 0
        queued = self.queue.qsize()
        super().send_receive_event_to_app()
        self._forget_last_frame()
        if self.queue.qsize() > queued:
            self._queued_charges.append(charge)
        elif charge and self.budget is not None:
            self.budget.release(charge)  # discarded (the connection is closing)

    def _forget_last_frame(self) -> None:
        """websockets' frame parser keeps its last frame in a local until the next frame
        arrives, so a connection gone quiet after a 63 MiB message would hold it, uncharged,
        for as long as it stays open (16 such connections held 1.2 GB). When the parser waits
        at a frame boundary with nothing buffered, it holds no other state than that frame:
        a fresh parser in its place is the same parser without it, and costs no copy."""
        conn = self.conn
        if conn.state is not State.OPEN or conn.reader.buffer:
            return
        waiting: object = conn.parser
        while isinstance(waiting, types.GeneratorType) and waiting.gi_yieldfrom is not None:
            waiting = waiting.gi_yieldfrom
        if not (isinstance(waiting, types.GeneratorType) and waiting.__name__ == "at_eof"):
            return  # mid-frame: the next frame replaces it soon
        fresh = Protocol.parse(conn)
        next(fresh)  # runs to the same wait for data
        conn.parser = fresh

    async def receive(self) -> Any:
        """The next ASGI message; a data message's charge passes to the application, which
        charges it before anything else runs."""
        message = await super().receive()
        if message["type"] == "websocket.receive" and self._queued_charges:
            charge = self._queued_charges.popleft()
            if self.budget is not None:
                self.budget.release(charge)
        return message

    def connection_lost(self, exc: Exception | None) -> None:
        """Give back what a message cut off by the connection's end, or queued and never
        taken, was charged."""
        self._release_reading()
        while self._queued_charges and self.budget is not None:
            self.budget.release(self._queued_charges.popleft())
        scope = getattr(self, "scope", None)
        if scope is not None:
            # The scope outlives the connection in places; the sender holds the protocol.
            scope["extensions"].pop(SEND_TEXTS, None)
        super().connection_lost(exc)

    def _release_reading(self) -> None:
        if self._reading and self.budget is not None:
            self.budget.release(self._reading)
        self._reading = 0

    def _refuse_over_budget(self) -> None:
        """Close with 1013 (try again later), dropping the message being read."""
        self._release_reading()
        # Free what was read of the message now, not when the protocol is collected.
        self.frames = []
        self.conn.reader.buffer.clear()
        self.conn.send_close(OVER_BUDGET_CLOSE, OVER_BUDGET_REASON)
        code, reason = OVER_BUDGET_CLOSE, OVER_BUDGET_REASON
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self._refused = True
        # Reading goes on (and drops what comes) so a client still sending sees the close
        # frame; one that does not close in turn is dropped.
        self._linger_then_close()

    async def send_texts(self, payloads: Sequence[bytes]) -> None:
        """Text frames of ``payloads`` (UTF-8), in order, in one write to the socket.

        What a ``websocket.send`` message does for each, except that the frames of the events
        that are ready together cost one transport write (a system call) rather than one each,
        and their text is not decoded to ``str`` and encoded back on the way.
        """
        await self.writable.wait()
        if self.disconnected or self.close_sent:
            raise ClientDisconnected()
        conn = self.conn
        for payload in payloads:
            conn.send_text(payload)
        self.transport.write(b"".join(conn.data_to_send()))

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


#: What WebSocket mode filters in uvicorn's error log (installed by
#: ``server.start_http_server``).
LOG_FILTERS: tuple[logging.Filter, ...] = (_DenialLogFilter(), _ClientFaultLogFilter())
