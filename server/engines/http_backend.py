"""What the engines that call a model over HTTP share: the pooled client session, the API key,
reading a server-sent event stream, and turning a backend's bad answers into ``EngineError``.

Both the completions engine and the upstream Responses engine use these, so a backend that
misbehaves is reported the same way whichever engine called it.
"""

from __future__ import annotations

import os

import aiohttp
import orjson
from bidi_responses.schema import JSONObject

from ..core.ports import EngineError

__all__ = [
    "RetryableError",
    "SSELineSplitter",
    "SessionPool",
    "bearer_headers",
    "broken_stream",
    "decode_object",
    "error_message",
    "error_text",
    "sse_data",
]


class RetryableError(Exception):
    """A failure before anything was streamed: the request may be sent again. ``fresh``: an
    upstream lost the chain, so the retry must send the whole conversation."""

    def __init__(self, code: str, message: str, *, fresh: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.fresh = fresh


def broken_stream(
    message: str, *, streamed: bool, code: str = "engine_stream_broken", fresh: bool = False
) -> EngineError | RetryableError:
    """The error for an answer that broke off: final (``engine_stream_broken``) once anything
    was streamed, since a retry would repeat it; before that a ``RetryableError`` with
    ``code``."""
    if streamed:
        return EngineError("engine_stream_broken", message)
    return RetryableError(code, message, fresh=fresh)


class SessionPool:
    """One engine's ``aiohttp`` session, opened on first use (and again after a close)."""

    def __init__(self, connect_timeout_s: float, max_connections: int = 100) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    def get(self) -> aiohttp.ClientSession:
        """The open session."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                # One session serves every tenant's requests: a cookie a backend sets must not
                # ride along with the next caller's (and none is read per request).
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=self._connect_timeout_s, sock_connect=None
                ),
                json_serialize=lambda value: orjson.dumps(value).decode(),
            )
        return self._session

    async def aclose(self) -> None:
        """Close the session's connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None


def bearer_headers(api_key_env: str, who: str) -> dict[str, str]:
    """``Authorization: Bearer`` with the key from the environment variable ``api_key_env``
    (none when it is empty); ``who`` names the server in the error when the key is missing."""
    if not api_key_env:
        return {}
    key = os.environ.get(api_key_env)
    if not key:
        raise EngineError(
            "engine_unavailable",
            f"The {who}'s API key is missing: environment variable {api_key_env} is not set.",
        )
    return {"Authorization": f"Bearer {key}"}


class SSELineSplitter:
    """Splits a byte stream into lines, refusing a line longer than ``max_line_bytes`` (a
    server that never ends its line must not make the engine hold unbounded memory)."""

    def __init__(self, max_line_bytes: int, who: str) -> None:
        # A long line comes in many chunks: appending to a bytearray and looking for the line
        # end in the new chunk only keeps each chunk's cost to its own size.
        self._buffer = bytearray()
        self._max = max_line_bytes
        self._who = who

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines ``chunk`` completes, stripped, without the blank ones (SSE's event
        separators: every reader here takes one ``data:`` line as one event, and a streamed
        completion sends one event a token, so the blank lines were half of what it read);
        the rest waits for the next chunk."""
        self._buffer += chunk
        if b"\n" not in chunk:  # what was buffered before holds no line end either
            if len(self._buffer) > self._max:
                raise EngineError(
                    "engine_bad_response",
                    f"The {self._who} sent a line longer than {self._max} bytes.",
                )
            return []
        *lines, self._buffer = self._buffer.split(b"\n")
        return [bytes(stripped) for line in lines if (stripped := line.strip())]


def sse_data(line: bytes) -> bytes | None:
    """The payload of an SSE ``data:`` line; None for a blank line, a comment or another
    field (``event:``, ``id:``)."""
    if not line.startswith(b"data:"):
        return None
    return line[5:].strip()


def decode_object(raw: str | bytes, sender: str) -> JSONObject:
    """One JSON object a server sent (an event, a chunk); ``engine_bad_response`` if it is not
    one. ``sender`` starts the error message: "The backend sent a chunk"."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise EngineError(
            "engine_bad_response", f"{sender} that is not JSON: {raw[:120]!r}."
        ) from None
    if not isinstance(value, dict):
        raise EngineError("engine_bad_response", f"{sender} that is not an object.")
    return value


def error_message(text: str) -> str:
    """The message of an error response's body (OpenAI shape, else the body's start)."""
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text[:300].strip() or "(empty body)"
    return error_text(data) if isinstance(data, dict) else text[:300]


def error_text(data: JSONObject) -> str:
    """The message of an OpenAI-shaped error object (``{"error": {"message": ...}}``)."""
    error = data.get("error", data)
    if isinstance(error, dict):
        return str(error.get("message") or error)[:500]
    return str(error)[:500]
