"""HTTP+SSE and WebSocket mode on the core: Starlette routes served by uvicorn.

The same event pipeline as gRPC, in two more framings: ``POST /v1/responses`` with SSE or a
JSON body (``responses.py``, ``sse.py``), WebSocket mode at ``GET /v1/responses``
(``websocket.py``), the routes beside them (``surface.py``, ``ops.py``), all assembled in
``app.py`` and served by ``server.py``. Errors use OpenAI's JSON error shape over HTTP
(``errors.py``) and the nested ``error`` event on the socket.
"""

from .app import HttpTransport
from .errors import error_body
from .framing import sse_frame, ws_batch_frame, ws_frame
from .server import StopHttp, start_http_server
from .sse import sse_stream

__all__ = [
    "HttpTransport",
    "StopHttp",
    "error_body",
    "sse_frame",
    "sse_stream",
    "start_http_server",
    "ws_batch_frame",
    "ws_frame",
]
