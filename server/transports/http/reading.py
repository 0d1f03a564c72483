"""Reading a request: its caller from ``Authorization``, its body as JSON within the limit."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from bidi_responses.schema import JSONValue
from starlette.requests import HTTPConnection, Request

from ...core import TransportPort
from ...core.api import ApiError
from ...core.tenancy import over_budget
from ..admission import Caller, identify
from .errors import invalid_json, too_large


def caller(core: TransportPort, headers: Mapping[str, str], peer: str | None = None) -> Caller:
    """The caller named by ``Authorization``; ApiError 401 when keys are on and it is missing
    or wrong."""
    return identify(core.keys, headers.get("authorization"), peer)


def peer_of(connection: HTTPConnection) -> str | None:
    """The client's address as ``host:port`` (None when the server does not know it)."""
    client = connection.client
    return f"{client.host}:{client.port}" if client is not None else None


async def read_json(core: TransportPort, request: Request) -> JSONValue:
    """The request body as JSON, refusing bodies over the configured message limit.

    A body with a ``Content-Encoding`` (gzip, ...) is refused with a 415 naming it.

    The body counts against the server-wide budget (``core.request_bytes``) while it is read
    and parsed, as the transport's copies of a one-shot request times its bytes (the growing
    buffer, then its parsed form), charged as they arrive (a declared length reserves
    nothing, so a client that declares much and sends little holds little); a declared length
    the budget cannot take now is refused before anything is read.
    """
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        # Bodies are read as sent: the size limit and the budget count the bytes the server
        # holds, which a compressed body would not be (nor would it parse).
        raise ApiError(
            f"Content-Encoding '{encoding[:40]}' is not supported: send the JSON body "
            "uncompressed.",
            code="unsupported_content_encoding",
            param="content-encoding",
            status=415,
        )
    limit = core.limits.max_message_bytes
    budget = core.request_bytes
    copies = core.naming.one_shot_copies
    length = request.headers.get("content-length")
    declared = int(length) if length is not None and length.isdigit() else 0
    if declared > limit:
        raise too_large(limit)
    if budget.limit and budget.held + declared * copies > budget.limit:
        budget.refused += 1
        raise over_budget(budget.limit, declared * copies)
    held = 0
    try:
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_large(limit)
            budget.take(len(chunk) * copies)
            held += len(chunk) * copies
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise invalid_json(str(exc)) from None
    finally:
        budget.release(held)


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
