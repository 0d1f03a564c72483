"""The benchmark's clients: one per mode, the agent loop they share, and the worker process.

Every mode runs the same agent loop (``run_agent``) over a different connection type; the
only differences are what each design sends and how:

===  ==============  =========================================================================
 #   key             what one turn is
===  ==============  =========================================================================
 1   http_new        POST /v1/responses (SSE), full history, a new TCP connection per turn
 2   http_keepalive  POST /v1/responses (SSE), full history, one kept-alive connection
 3   http_store      POST /v1/responses (SSE), new input + previous_response_id (store=true)
 4   ws_cache        WebSocket response.create, new input + previous_response_id (conn cache)
 5   ws_append       WebSocket, one response: response.done / response.append per tool call
 6   grpc_create     gRPC CreateResponse (server-streaming) per turn, full history
 7   grpc_connect    gRPC Connect stream, new input + previous_response_id (stream cache)
 8   grpc_append     gRPC Connect, one response: response_done / response_append per call
 9   grpc_single     as 7, one event per gRPC message and the server's 2 ms delta window (what
                     a stock client that sets no options gets)
10   grpc_slim       as 7, with slim snapshots (no echoed instructions and tools)
11   ws_batched      as 4, with batched frames (non-standard: a JSON array of the events
                     ready together per frame; a reference, no hosted-API client reads it)
12   grpc_tokens     as 7, with the server's 2 ms delta window instead of the client's 20 ms
                     (``DeliveryOptions.delta_window_ms``: a delta every token or two)
===  ==============  =========================================================================

The gRPC modes use the project's client, which asks for batched messages and a 20 ms delta window
(modes 6-8, 10); mode 9 turns both off, mode 12 only the window.

HTTP uses aiohttp (an efficient async client, measured here at 2-3x
faster than httpx). The WebSocket client is the ``websockets`` library with compression off,
as the OpenAI SDK connects. gRPC uses this project's ``AsyncResponsesClient``.

Clients run in worker processes (``worker_main``), separate from the server and from the
orchestrator; a worker receives commands over a pipe, runs them on its own event loop, and
sends back plain-dict results.

The package, one job per module: ``modes`` (the table above), ``exchange`` (one turn on a
connection), ``http_conn``, ``ws_conn`` and ``grpc_conn`` (a connection per transport), ``kit``
(the shared client objects), ``agent`` (the loop), ``steering`` (one steered response per
stream transport) and ``worker`` (the client process).
"""

from __future__ import annotations

from .agent import AgentRun, TurnRecord, run_agent
from .commands import (
    AgentsCommand,
    AgentsResult,
    Command,
    KeepupCommand,
    KeepupResult,
    SteerCommand,
    SteerResult,
    SteerRound,
)
from .exchange import BenchError, Conn, Exchange, ServerAddress
from .grpc_conn import GrpcConnectConn, GrpcCreateConn
from .http_conn import HttpConn
from .kit import ClientKit
from .modes import CLASSIC_MODES, MODES, ModeInfo, resolve_modes
from .worker import worker_main
from .ws_conn import WsConn

__all__ = [
    "CLASSIC_MODES",
    "MODES",
    "AgentRun",
    "AgentsCommand",
    "AgentsResult",
    "BenchError",
    "ClientKit",
    "Command",
    "Conn",
    "Exchange",
    "GrpcConnectConn",
    "GrpcCreateConn",
    "HttpConn",
    "KeepupCommand",
    "KeepupResult",
    "ModeInfo",
    "ServerAddress",
    "SteerCommand",
    "SteerResult",
    "SteerRound",
    "TurnRecord",
    "WsConn",
    "resolve_modes",
    "run_agent",
    "worker_main",
]
