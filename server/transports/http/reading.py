"""Reading a request: its caller from ``Authorization``, its body as JSON within the limit."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from bidi_responses.server.core.api.errors import ApiError
from bidi_responses.server.core.api.items import JSONValue
from bidi_responses.server.core.service import ResponsesCore
from bidi_responses.server.transports.admission import Caller, identify
from bidi_responses.server.transports.http.errors import invalid_json, too_large
from starlette.requests import HTTPConnection, Request


def caller(core: ResponsesCore, headers: Mapping[str, str], peer: str | None = None) -> Caller:
    """The caller named by ``Authorization``; ApiError 401 when keys are on and it is missing
    or wrong."""
    return identify(core.keys, headers.get("authorization"), peer)


def peer_of(connection: HTTPConnection) -> str | None:
    """The client's address as ``host:port`` (None when the server does not know it)."""
    client = connection.client
    return f"{client.host}:{client.port}" if client is not None else None


async def read_json(core: ResponsesCore, request: Request) -> JSONValue:
    """The request body as JSON, refusing bodies over the configured message limit."""
    limit = core.config.limits.max_message_bytes
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    try:
        return orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        raise invalid_json(str(exc)) from None


def query_int(request: Request, name: str, default: int) -> int:
    """An integer query parameter (``default`` when absent or empty); a 400 naming it if it is
    not an integer."""
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise ApiError(
            f"Invalid '{name}': expected an integer.", code="invalid_type", param=name
        ) from None
