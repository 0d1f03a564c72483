"""The peers benchmark's one instant fake model: every server under test calls the same process.

It serves two APIs on one port:

- ``POST /v1/completions``: the token-level API this project's ``completions`` route uses (the
  simulated engine of ``bench.sim_backend``, whose settings the route sends in each request);
- ``POST /v1/responses``: the Responses API a pass-through gateway (SMG with ``--backend
  openai``) forwards to, with the whole history as ``input``. It answers with one function
  call while fewer than ``--tool-rounds`` tool outputs are in the input, then with a short
  text, as the sim does; streamed (``stream: true``) or as one JSON response.

The model reports its own time: ``GET /stats`` gives the requests served and the sum of their
handling time (from the request's arrival to its last byte written, measured by a middleware
around both APIs), so a client running one turn at a time subtracts the model's time from the
turn it observed, whatever the server between them passes through.

Run: ``python -m bidi_responses.bench.peers_model --port 0 --tool-rounds 19``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
from collections.abc import Awaitable, Callable, Sequence

import orjson
from aiohttp import web
from bidi_responses.schema import JSONObject

from .sim_backend import SimBackend, serve

__all__ = ["FakeModel", "main"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# The call the model makes: about the size of the sim's function calls (40 tokens).
_ARGUMENTS = orjson.dumps(
    {"cmd": "grep -rn 'def handle_request' src/ && sed -n '1,120p' src/server/handlers.py"}
).decode()
_ANSWER = "The failing test now passes; the handler validates its input before dispatch."


class FakeModel(SimBackend):
    """The sim's completions endpoint and a Responses endpoint, timed (module docstring)."""

    def __init__(self, tool_rounds: int) -> None:
        super().__init__()
        self.tool_rounds = tool_rounds
        self.model_ns = 0
        self._ids = itertools.count(1)

    @web.middleware
    async def _timed(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter_ns()
        response = await handler(request)
        if not response.prepared:  # a JSON reply: its bytes are written here, not later
            await response.prepare(request)
            await response.write_eof()
        self.model_ns += time.perf_counter_ns() - started
        return response

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/responses``: a function call until the tool rounds are done, then text."""
        body = orjson.loads(await request.read())
        if not isinstance(body, dict):
            return web.json_response({"error": {"message": "expected an object"}}, status=400)
        self.requests += 1
        items = body.get("input")
        history = items if isinstance(items, list) else []
        rounds = sum(
            1
            for item in history
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        )
        n = next(self._ids)
        item: JSONObject
        if rounds < self.tool_rounds:
            item = {
                "type": "function_call",
                "id": f"fc_{n}",
                "call_id": f"call_{n}",
                "name": "exec_command",
                "arguments": _ARGUMENTS,
                "status": "completed",
            }
        else:
            item = {
                "type": "message",
                "id": f"msg_{n}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": _ANSWER, "annotations": []}],
            }
        # A byte-count estimate stands in for a tokenizer: the gateway only passes it on.
        prompt_tokens = (request.content_length or 0) // 4
        response: JSONObject = {
            "id": f"resp_fake{n}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": str(body.get("model", "")),
            "output": [item],
            "usage": {
                "input_tokens": prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 40,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt_tokens + 40,
            },
        }
        if not body.get("stream"):
            return web.Response(body=orjson.dumps(response), content_type="application/json")
        stream = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await stream.prepare(request)
        created = {**response, "status": "in_progress", "output": [], "usage": None}
        events: list[JSONObject] = [
            {"type": "response.created", "response": created},
            {"type": "response.output_item.added", "output_index": 0, "item": item},
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {"type": "response.completed", "response": response},
        ]
        for seq, event in enumerate(events):
            event["sequence_number"] = seq
            await stream.write(
                b"event: "
                + str(event["type"]).encode()
                + b"\ndata: "
                + orjson.dumps(event)
                + b"\n\n"
            )
        await stream.write_eof()
        return stream

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "sim-model", "object": "model", "owned_by": "sim"}]}
        )

    async def stats(self, _request: web.Request) -> web.Response:
        return web.json_response({"requests": self.requests, "model_ms": self.model_ns / 1e6})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30, middlewares=[self._timed])
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/stats", self.stats)
        return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    parser.add_argument("--tool-rounds", type=int, default=19)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.host, args.port, FakeModel(args.tool_rounds).app()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
