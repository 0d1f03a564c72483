"""One steered response on a stream, as each transport's client sees it: the steer is sent
``STEER_AFTER_S`` after the create (once the target's ``response.created`` has arrived); the
round ends with the automatic successor's terminal event (or the target's, if the steer was
refused).

Why a fixed delay after the create rather than "at ``response.created``": the target stops at
its next engine event, a fixed point of its engine time, so a steer sent when ``created``
arrives would be timed from a moment that comes later on a transport that delivers ``created``
later, and that transport would look faster. From a fixed point after the create, every
transport-dependent leg (the create up, the first token down) counts for what it costs.

WebSocket mode reads raw frames; Connect uses the project's client (``steer`` for the
acknowledgement, ``follow_events`` for the successor), as the rollouts do.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import orjson

from ..jsontypes import JSONObject
from .commands import SteerRound
from .exchange import BenchError

if TYPE_CHECKING:
    from bidi_responses.client.stream import ConnectStream
    from websockets.asyncio.client import ClientConnection

__all__ = ["STEERING_TEXT", "steer_round_grpc", "steer_round_ws"]

#: What every round steers with.
STEERING_TEXT = "Stop there and answer in one short sentence instead."
#: When the steer is sent, after the create (the target's first token comes later).
STEER_AFTER_S = 0.005
_TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete"})


async def steer_round_ws(ws: ClientConnection, body: JSONObject) -> SteerRound:
    """One round over WebSocket mode (JSON text frames)."""
    t_create = time.perf_counter()
    await ws.send(orjson.dumps({"type": "response.create", **body}).decode())
    target: JSONObject = {}
    successor_id: str | None = None
    t_steer = t_ack = 0.0
    t_first: float | None = None
    accepted: bool | None = None
    while True:
        frame = orjson.loads(await ws.recv())
        now = time.perf_counter()
        for event in frame if isinstance(frame, list) else (frame,):
            kind = event["type"]
            if kind == "response.created" and not target:
                target = event["response"]
                steer = {
                    "type": "response.steer",
                    "previous_response_id": target["id"],
                    "input": STEERING_TEXT,
                }
                t_steer = await _steer_time(t_create)
                await ws.send(orjson.dumps(steer).decode())
            elif kind == "response.created":
                successor_id = event["response"]["id"]
            elif kind in ("response.steer.accepted", "response.steer.failed") and accepted is None:
                t_ack, accepted = now, kind == "response.steer.accepted"
            elif kind == "response.output_text.delta" and successor_id and t_first is None:
                t_first = now
            elif kind in _TERMINAL and event["response"]["id"] == target.get("id"):
                target = event["response"]
                if accepted is False:
                    return _round(t_steer, t_ack, None, False, target, None)
            elif kind in _TERMINAL and event["response"]["id"] == successor_id:
                return _round(t_steer, t_ack, t_first, True, target, event["response"])
            elif kind == "error":
                raise BenchError(f"steering round failed: {event}")


async def steer_round_grpc(stream: ConnectStream, body: JSONObject) -> SteerRound:
    """One round over Connect with the project's client."""
    target: JSONObject = {}
    t_steer = t_ack = 0.0
    accepted = False
    t_create = time.perf_counter()
    async for event in stream.create_events(**body):
        kind = event["type"]
        if kind == "response.created":
            target = event["response"]
            t_steer = await _steer_time(t_create)
            ack = await stream.steer(previous_response_id=target["id"], input=STEERING_TEXT)
            t_ack, accepted = time.perf_counter(), ack.accepted
        elif kind in _TERMINAL:
            target = event["response"]
        elif kind == "error":
            raise BenchError(f"steering round failed: {event}")
    if not accepted:
        return _round(t_steer, t_ack, None, False, target, None)
    t_first: float | None = None
    successor: JSONObject | None = None
    async for event in stream.follow_events(target["id"]):
        kind = event["type"]
        if kind == "response.output_text.delta" and t_first is None:
            t_first = time.perf_counter()
        elif kind in _TERMINAL:
            successor = event["response"]
    return _round(t_steer, t_ack, t_first, True, target, successor)


async def _steer_time(t_create: float) -> float:
    """Wait until ``STEER_AFTER_S`` after the create (at once if that is past); the time the
    steer goes out."""
    wait = t_create + STEER_AFTER_S - time.perf_counter()
    if wait > 0:
        await asyncio.sleep(wait)
    return time.perf_counter()


def _round(
    t_steer: float,
    t_ack: float,
    t_first: float | None,
    accepted: bool,
    target: JSONObject,
    successor: JSONObject | None,
) -> SteerRound:
    details = target.get("incomplete_details") or {}
    return {
        "t_steer": t_steer,
        "t_ack": t_ack,
        "t_successor_first_token": t_first,
        "accepted": accepted,
        "target_status": str(target.get("status")),
        "target_reason": details.get("reason"),
        "successor_status": successor.get("status") if successor is not None else None,
    }
