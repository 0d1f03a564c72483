"""``CreateResponse``: the stateless baseline, one server-streaming call per turn.

Pre-serialized like Connect: the call yields ``CreateResponseResponse`` wire bytes. A request
error ends the call with its status, never OK.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

from bidi_responses.codec import ProtoDecoder
from bidi_responses.schema import JSONObject, snapshot_of
from bidi_responses.v1 import responses_pb2 as pb

from ...core import TransportPort
from ...core.api import ApiError
from ...core.runs import TERMINAL_TYPES, OutEvent
from ..admission import Caller, shutting_down
from ..errors import error_from_event
from .context import Context, caller_of
from .decoding import decode_request
from .delivery import Delivery, Outbound, as_create_response
from .status import abort


async def create_response(
    core: TransportPort, raw: bytes, context: Context
) -> AsyncGenerator[bytes, None]:
    """Run one create and stream its events (background mode: follow its event log)."""
    caller = caller_of(core.keys, context)
    create = decode_request(pb.CreateResponseRequest, raw, "CreateResponse")
    if core.one_shot.draining:
        raise shutting_down("streams")
    outbound = Outbound(Delivery.from_pb(create.delivery, core.streaming))
    body = ProtoDecoder.params_to_dict(create.params, ProtoDecoder.tool_keys(raw, unary=True))
    if body.get("background") is True:
        events = _background(core, body, caller, context, outbound)
    else:
        events = _stateless(core, body, caller, context, outbound)
    async with contextlib.aclosing(events):
        async for message in events:
            yield message


async def _background(
    core: TransportPort, body: JSONObject, caller: Caller, context: Context, out: Outbound
) -> AsyncGenerator[bytes, None]:
    """The response runs on its own; this call only reads its event log, so dropping the call
    leaves it running (resume with StreamResponse)."""
    one_shot = core.one_shot
    first = await one_shot.start_background(body, core.naming.one_shot, caller)
    if first["type"] == "error":
        yield out.event_field(first)
        await abort(context, error_from_event(first))
    response = snapshot_of(first)
    assert response is not None  # a background response begins with response.created
    async for data in one_shot.background_events(response["id"], -1, caller.tenant):
        yield out.event_field(data)


async def _stateless(
    core: TransportPort, body: JSONObject, caller: Caller, context: Context, out: Outbound
) -> AsyncGenerator[bytes, None]:
    """One stateless create: one message per event, or batched if the delivery asks."""
    one_shot, transport = core.one_shot, core.naming.one_shot
    failure: ApiError | None = None
    ended = False
    if out.delivery.max_events <= 1:
        async for data in one_shot.respond(body, transport, caller):
            yield out.event_field(data)
            ended = ended or data["type"] in TERMINAL_TYPES
            if data["type"] == "error":
                failure = error_from_event(data)
    else:
        batches = one_shot.respond_batches(body, transport, caller, out.delivery.max_events)
        async with contextlib.aclosing(batches):
            async for ready in batches:
                for message in out.messages(OutEvent("", d) for d in ready):
                    yield as_create_response(message)
                for data in ready:
                    ended = ended or data["type"] in TERMINAL_TYPES
                    if data["type"] == "error":
                        failure = error_from_event(data)
    if failure is not None:
        # A request error ends the call with its status, never OK.
        await abort(context, failure)
    if not ended and one_shot.draining:
        # Stopped at the end of a drain's grace period: never OK without a terminal event.
        raise shutting_down("streams")
