"""Serving the app with uvicorn: listen, start, and a graceful stop that the app drives.

uvicorn runs through its public API: a ``Config``, ``Server.serve(sockets=...)`` on a socket
bound here (so the port is known at once, and worker processes can share it), the app's
lifespan to learn that it is serving, ``should_exit`` to stop, and the config's graceful
shutdown timeout. The application, not uvicorn, owns SIGINT and SIGTERM (``app.serve``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterator

import uvicorn

from ...config import ServerConfig
from ...core import TransportPort
from ...core.observability import CLIENT_FAULTS, RateLimitFilter
from ...sockets import bound_socket
from ...tracing import wrap_asgi
from ..connections import ConnectionAccount, connection_caps
from .app import HttpTransport
from .listener import REFUSAL_GRACE_S, GuardedListener
from .sse import LOG_FILTERS as SSE_LOG_FILTERS
from .uvicorn_ws import LOG_FILTERS as WS_LOG_FILTERS
from .uvicorn_ws import WebSocketProtocol

StopHttp = Callable[[float], Awaitable[None]]


class _AppOwnsSignals(uvicorn.Server):
    """uvicorn's server, minus its signal handlers: the one lifecycle override kept.

    ``Server.serve`` always runs inside ``capture_signals``, which swaps in uvicorn's own
    SIGINT and SIGTERM handlers and, when serving ends, puts back the ones it found. The app
    installs its own (``app.serve``, ``workers``), and one of the two would lose: either
    uvicorn takes the signal and at once closes the listener and every WebSocket (close
    1012), skipping the drain (NOT_SERVING first, the drain notice, in-flight turns
    finishing), or uvicorn's exit puts the default handlers back while the app is still
    draining, so a second SIGTERM or Ctrl+C kills the process mid-drain. uvicorn (0.54) has
    no setting to leave signals alone, hence this override of its public hook.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Install no signal handlers."""
        yield


def _listen(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A listening socket, so the bound port is known before uvicorn starts serving."""
    sock = bound_socket(host, port, reuse_addr=True, reuse_port=reuse_port)
    try:
        # Listening now queues early connections in the backlog until uvicorn accepts them.
        sock.listen(2048)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _config(
    transport: HttpTransport, core: TransportPort, settings: ServerConfig
) -> uvicorn.Config:
    tls = settings.tls
    return uvicorn.Config(
        wrap_asgi(transport.asgi, settings.tracing),
        ssl_certfile=tls.cert_file if tls.enabled else None,
        ssl_keyfile=tls.key_file if tls.enabled else None,
        ssl_ca_certs=tls.client_ca_file if tls.enabled else None,
        ssl_cert_reqs=ssl.CERT_REQUIRED if tls.enabled and tls.client_ca_file else ssl.CERT_NONE,
        # The app's lifespan tells ``start_http_server`` that the server is up.
        lifespan="on",
        log_level="warning",
        log_config=None,
        access_log=False,
        http="auto",
        interface="asgi3",
        ws=WebSocketProtocol.bound_to(core.request_bytes, core.naming.stream_copies),
        # Refused from the frame header (close 1009), before the payload is buffered; for a
        # compressed message, before it inflates past the limit.
        ws_max_size=core.limits.max_message_bytes,
        # Off by default: a compressed message is small on the wire and large in memory
        # (see WebSocketProtocol for how inflated bytes are charged when it is on).
        ws_per_message_deflate=core.limits.websocket_compression,
        server_header=False,
    )


def _asyncio_accept_kind(record: logging.LogRecord) -> str | None:
    message = record.getMessage()
    return "asyncio-accept" if "accept() out of system resource" in message else None


#: Should an ``accept()`` failure still reach asyncio (a socket this module did not guard),
#: its ERROR line with a traceback is held to the client-fault rate.
_ASYNCIO_ACCEPT_FILTER = RateLimitFilter(CLIENT_FAULTS, _asyncio_accept_kind)


def _uvicorn_client_fault_kind(record: logging.LogRecord) -> str | None:
    message = record.getMessage()
    if "Invalid HTTP request received" in message:
        return "http-invalid-request"
    if "invalid UTF-8" in message:
        return "websocket-invalid-utf8"
    return None


#: uvicorn logs one line per connection that sends garbage (or invalid UTF-8): a client
#: decides how many, so they are held to the client-fault rate too.
_UVICORN_CLIENT_FAULT_FILTER = RateLimitFilter(CLIENT_FAULTS, _uvicorn_client_fault_kind)


def _quiet_uvicorn_logs() -> None:
    """Install the transports' filters on uvicorn's error log, once each: they turn the false
    alarms it logs for outcomes the app handled (a denial before the WebSocket upgrade, a
    client's invalid UTF-8, an SSE stream cut off by the write timeout) into what they are."""
    uvicorn_log = logging.getLogger("uvicorn.error")
    for log_filter in (*WS_LOG_FILTERS, *SSE_LOG_FILTERS, _UVICORN_CLIENT_FAULT_FILTER):
        if log_filter not in uvicorn_log.filters:
            uvicorn_log.addFilter(log_filter)
    asyncio_log = logging.getLogger("asyncio")
    if _ASYNCIO_ACCEPT_FILTER not in asyncio_log.filters:
        asyncio_log.addFilter(_ASYNCIO_ACCEPT_FILTER)


def _guarded(
    sock: socket.socket, core: TransportPort, *, tls: bool
) -> tuple[GuardedListener, ConnectionAccount]:
    """``sock`` as a listener that accounts for its connections (``connections.py``)."""
    caps = connection_caps(core.limits)
    account = ConnectionAccount(caps)
    metrics = core.metrics
    metrics.connection_limit.labels("http", "server").set(caps.http)
    metrics.connection_limit.labels("http", "peer").set(caps.per_peer)
    metrics.descriptor_limit.set(caps.descriptors)
    listener = GuardedListener.wrap(sock, account, metrics, tls=tls)
    loop = asyncio.get_running_loop()

    def silence_refused(conn: socket.socket) -> None:
        # A refused connection that never sends its request is closed after a while; the
        # shutdown makes its transport see the end and close it the usual way.
        def end() -> None:
            if conn.fileno() != -1:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)

        loop.call_later(REFUSAL_GRACE_S, end)

    listener.on_refused = silence_refused
    return listener, account


async def _started(serving: asyncio.Task[None], transport: HttpTransport) -> None:
    """Wait until the app's lifespan has started; raise what stopped the server instead (an
    unreadable certificate, say)."""
    started = asyncio.ensure_future(transport.started.wait())
    try:
        await asyncio.wait((serving, started), return_when=asyncio.FIRST_COMPLETED)
    finally:
        started.cancel()
    if not transport.started.is_set():
        serving.result()  # raises the start-up error
        raise OSError("the HTTP server stopped while starting")


async def start_http_server(
    core: TransportPort,
    settings: ServerConfig,
    host: str,
    port: int,
    *,
    reuse_port: bool = False,
) -> tuple[StopHttp, int]:
    """Serve HTTP+SSE and WebSocket mode over what the application hands this transport
    (``core``) and the server's ``settings`` (TLS, tracing, the metrics path); returns an
    async ``stop(grace)`` and the bound port.

    ``port`` 0 picks a free port. ``stop`` lets in-flight work finish for up to ``grace``
    seconds, then cancels what is left.
    """
    listening = _listen(host, port, reuse_port=reuse_port)
    sock, account = _guarded(listening, core, tls=settings.tls.enabled)
    transport = HttpTransport(core, settings.metrics_path, account)
    try:
        config = _config(transport, core, settings)
    except BaseException:
        sock.close()
        raise
    _quiet_uvicorn_logs()
    bound = int(sock.getsockname()[1])
    server = _AppOwnsSignals(config)
    serving = asyncio.get_running_loop().create_task(
        server.serve(sockets=[sock]), name="http-server"
    )
    try:
        await _started(serving, transport)
    except BaseException:
        sock.close()
        raise

    async def stop(grace: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        await transport.drain(grace)
        # SSE responses still running get what is left of the grace period. The floor lets
        # uvicorn see connections it has just closed go away, instead of reporting a timeout.
        # uvicorn annotates this as int but hands it to asyncio.wait_for, which takes seconds.
        config.timeout_graceful_shutdown = max(deadline - loop.time(), 0.05)  # type: ignore[assignment]
        server.should_exit = True
        try:
            await serving
        finally:
            sock.close()
            # uvicorn cancels handlers that outlive the grace period but does not wait for
            # them; wait here so their cleanup (closing sessions) runs before the core closes.
            await transport.handlers_done()

    return stop, bound
