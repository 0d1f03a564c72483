"""The shared client objects of one worker run, and a connection of the right kind per agent."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import TYPE_CHECKING

from ..wire import WireCounter
from .exchange import Conn, ServerAddress
from .grpc_conn import GrpcConnectConn, GrpcCreateConn
from .http_conn import HttpConn
from .modes import ModeInfo
from .ws_conn import WsConn
from .ws_lanes import WsLanes

if TYPE_CHECKING:
    import aiohttp
    from bidi_responses.client.aio import AsyncResponsesClient

__all__ = ["ClientKit"]


class ClientKit:
    """The shared client objects of one worker run: an HTTP session, a gRPC channel.

    One agent per process gets fresh ones per rollout, so every rollout pays its own
    connection setup; with several agents in a process they share what the library is meant
    to share (an aiohttp session's pool, a gRPC channel's HTTP/2 connection), while each
    agent has its own WebSocket connection or Connect stream.
    """

    def __init__(self, mode: ModeInfo, server: ServerAddress, wire: WireCounter | None) -> None:
        self.mode = mode
        self.server = server
        self.wire = wire
        scheme = "https" if server.tls_ca else "http"
        self.base = f"{scheme}://{server.host}:{server.http_port}"
        # TLS as a client deploys it: the server's certificate checked against its CA.
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context(cafile=server.tls_ca) if server.tls_ca else None
        )
        self._ca_pem = Path(server.tls_ca).read_bytes() if server.tls_ca else b""
        self._session: aiohttp.ClientSession | None = None
        self._grpc: AsyncResponsesClient | None = None

    async def __aenter__(self) -> ClientKit:
        if self.mode.transport == "http":
            import aiohttp

            # Mode 1 closes the connection after each response: a new TCP connection per turn.
            connector = aiohttp.TCPConnector(
                force_close=self.mode.key == "http_new",
                limit=0,
                ssl=self.ssl if self.ssl is not None else True,
            )
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None)
            )
        elif self.mode.transport == "grpc":
            from bidi_responses.client.aio import AsyncResponsesClient
            from bidi_responses.client.channel import DEFAULT_DELTA_WINDOW_MS

            window = self.mode.delta_window_ms
            target = f"{self.server.host}:{self.server.grpc_port}"
            channel = None
            if self.server.tls_ca:
                import grpc
                from bidi_responses.client.channel import CHANNEL_OPTIONS

                credentials = grpc.ssl_channel_credentials(self._ca_pem)
                channel = grpc.aio.secure_channel(target, credentials, options=CHANNEL_OPTIONS)
            self._grpc = AsyncResponsesClient(
                target,
                batch_events=self.mode.batch,
                snapshots="slim" if self.mode.slim else "full",
                delta_window_ms=DEFAULT_DELTA_WINDOW_MS if window is None else window,
                channel=channel,
            )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
        if self._grpc is not None:
            await self._grpc.close()

    async def shared(self) -> GrpcConnectConn | WsLanes:
        """One connection for agents on lanes: a Connect stream or a WebSocket connection
        (its owner closes it; each agent takes a view with ``lane``)."""
        if self.mode.transport == "ws":
            return await WsLanes.open(self.base, ssl=self.ssl)
        if self._grpc is None or self.mode.transport != "grpc" or self.mode.history != "chain":
            raise RuntimeError(f"mode {self.mode.key} has no lanes on one connection")
        return await GrpcConnectConn(self._grpc, self.wire).open()

    async def conn(self) -> Conn:
        """A connection for one agent."""
        mode = self.mode
        if mode.transport == "ws":
            return await WsConn.open(self.base, self.wire, batch=mode.batch, ssl=self.ssl)
        if mode.transport == "http":
            if self._session is None:
                raise RuntimeError("ClientKit.conn() outside its async with block")
            return HttpConn(self._session, self.base, self.wire)
        if self._grpc is None:
            raise RuntimeError("ClientKit.conn() outside its async with block")
        if mode.history in ("chain", "append"):
            return await GrpcConnectConn(self._grpc, self.wire).open()
        return GrpcCreateConn(self._grpc, self.wire)
