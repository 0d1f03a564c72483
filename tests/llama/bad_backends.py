"""Backends that misbehave, as real HTTP servers on loopback (aiohttp), one per URL path.

``/{mode}/v1/completions`` answers in the named way: ``slow`` sends its headers and then
nothing; ``garbage`` streams a chunk that is not JSON; ``text_only`` streams the tiny model's
answer as text without token ids (no logprobs), then its usage; ``busy`` answers 503
(retried); ``html`` answers a web page. ``replay`` streams the next recorded completion of
``replies`` (token ids) the way vLLM does (``token_ids`` per chunk, then usage), and keeps
each request's prompt; ``burst`` streams the same chunks all in one write, as a backend's
chunks arrive when the server reads them late. Requests are counted per mode.
"""

from __future__ import annotations

import asyncio
import collections
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web


class BadBackends:
    """The running server: its base URL per mode and the requests each mode received."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.requests: collections.Counter[str] = collections.Counter()
        self.never = asyncio.Event()  # what the slow modes wait on; set on shutdown
        self.replies: list[list[int]] = []  # replay: recorded completions, used in order
        self.prompts: list[list[int]] = []  # replay: the prompts received
        self.cached_tokens = 0  # replay: what the usage chunk reports as cached
        self.cookies: list[str | None] = []  # replay: each request's Cookie header

    def base_url(self, mode: str) -> str:
        """The OpenAI base URL of ``mode``."""
        return f"http://127.0.0.1:{self.port}/{mode}/v1"


BACKENDS = web.AppKey("backends", BadBackends)
# What the ``text_only`` backend says it sampled (<|channel|> final <|message|> Hello world .
# <|return|>).
TEXT_ONLY_TOKENS = 7


async def _handle(request: web.Request) -> web.StreamResponse:
    backends = request.app[BACKENDS]
    mode = request.match_info["mode"]
    backends.requests[mode] += 1
    body = await request.json()
    if mode in ("replay", "burst"):
        return await _replay(request, backends, body, burst=mode == "burst")
    if mode == "busy":
        return web.json_response({"error": {"message": "server overloaded"}}, status=503)
    if mode == "html":
        return web.Response(text="<html>502 Bad Gateway</html>", content_type="text/html")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if mode == "garbage":
        await response.write(b"data: <html>oops</html>\n\n")
    elif mode == "text_only":
        pieces = ["<|channel|>final<|message|>", "Hello", " world.", "<|return|>"]
        for n, text in enumerate(pieces):
            choice = {"index": 0, "text": text, "finish_reason": "stop" if n == 3 else None}
            await response.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": TEXT_ONLY_TOKENS}
        await response.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode())
        await response.write(b"\n\ndata: [DONE]\n\n")
        return response
    await backends.never.wait()  # hold the stream open: the client's timeout must end it
    return response


async def _replay(
    request: web.Request, backends: BadBackends, body: dict[str, Any], *, burst: bool = False
) -> web.StreamResponse:
    backends.prompts.append(list(body["prompt"]))
    backends.cookies.append(request.headers.get("Cookie"))
    tokens = backends.replies.pop(0)
    # A backend behind a load balancer may set a session cookie; the server must not send it
    # back (one client session serves every tenant).
    headers = {"Content-Type": "text/event-stream", "Set-Cookie": "lb-session=replica-1; Path=/"}
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)

    def chunk(data: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(data).encode() + b"\n\n"

    chunks = [
        chunk({"choices": [{"index": 0, "text": "", "token_ids": [token], "finish_reason": None}]})
        for token in tokens
    ]
    for data in [b"".join(chunks)] if burst else chunks:
        await response.write(data)
    finish = {"index": 0, "text": "", "token_ids": [], "finish_reason": "stop"}
    await response.write(chunk({"choices": [finish]}))
    usage = {
        "prompt_tokens": len(body["prompt"]),
        "completion_tokens": len(tokens),
        "prompt_tokens_details": {"cached_tokens": backends.cached_tokens},
    }
    await response.write(chunk({"choices": [], "usage": usage}))
    await response.write(b"data: [DONE]\n\n")
    return response


@asynccontextmanager
async def bad_backends() -> AsyncIterator[BadBackends]:
    """Start the misbehaving server on a free loopback port; stop it afterwards."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    backends = BadBackends(sock.getsockname()[1])
    app = web.Application()
    app[BACKENDS] = backends
    app.router.add_post("/{mode}/v1/completions", _handle)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    try:
        yield backends
    finally:
        backends.never.set()
        await runner.cleanup()


def closed_port() -> int:
    """A loopback port with nothing listening on it (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
