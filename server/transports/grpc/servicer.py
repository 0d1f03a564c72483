"""``ResponsesService``: protobuf in, core calls, protobuf out.

The servicer only converts. State lives in the core (sessions, stored responses, limits) and
errors are ``ApiError``s that the registration (``registration.py``) turns into statuses. The
two pre-serialized streaming calls have their own modules: ``connect.py`` and ``create.py``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

from bidi_responses.codec import ProtoDecoder, ProtoEncoder, item_to_dict, item_to_pb, usage_to_pb
from bidi_responses.schema import JSONObject
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc

from ...core import TransportPort
from ...core.api import ApiError
from ..admission import Caller
from .connect import StreamsPerConnection, connect_stream
from .context import Context, caller_of
from .create import create_response


class ResponsesServicer(pb_grpc.ResponsesServiceServicer):
    """One method per RPC, each a conversion around one core call."""

    def __init__(self, core: TransportPort, streams: StreamsPerConnection) -> None:
        self.core = core
        self.one_shot = core.one_shot
        self._streams = streams

    def _caller(self, context: Context) -> Caller:
        return caller_of(self.core.keys, context)

    # Pre-serialized (see registration.PRE_SERIALIZED): these send encoded bytes.
    async def Connect(  # type: ignore[override]
        self, request_iterator: AsyncIterator[bytes], context: Context
    ) -> AsyncGenerator[bytes, None]:
        """The stateful stream (``connect.py``). Its messages go out through
        ``context.write`` (the stream driver's writer task), so this generator yields none:
        a generator is the shape interceptors (OpenTelemetry's) expect of a streaming call."""
        await connect_stream(self.core, self._streams, request_iterator, context)
        return
        yield  # makes this a generator

    def CreateResponse(  # type: ignore[override]
        self, request: bytes, context: Context
    ) -> AsyncGenerator[bytes, None]:
        """The stateless baseline: one call per turn (``create.py``)."""
        return create_response(self.core, request, context)

    async def GetResponse(
        self, request: pb.GetResponseRequest, context: Context
    ) -> pb.GetResponseResponse:
        """A stored response."""
        tenant = self._caller(context).tenant
        response = await self.one_shot.get_response(request.response_id, tenant)
        return pb.GetResponseResponse(response=ProtoEncoder().response_to_pb(response))

    async def DeleteResponse(
        self, request: pb.DeleteResponseRequest, context: Context
    ) -> pb.DeleteResponseResponse:
        """Delete a stored response."""
        tenant = self._caller(context).tenant
        result = await self.one_shot.delete_response(request.response_id, tenant)
        return pb.DeleteResponseResponse(
            id=result["id"], object=result["object"], deleted=result["deleted"]
        )

    async def ListInputItems(
        self, request: pb.ListInputItemsRequest, context: Context
    ) -> pb.ListInputItemsResponse:
        """Page through a stored response's input items."""
        tenant = self._caller(context).tenant
        page = await self.one_shot.list_input_items(
            request.response_id,
            limit=request.limit or 20,
            order=request.order or "desc",
            after=request.after or None,
            tenant=tenant,
        )
        items = page["data"]
        data = _within_page_bytes([item_to_pb(i) for i in items])
        cut = len(data) < len(items)
        ids = [item.get("id") or "" for item in items[: len(data)]]
        return pb.ListInputItemsResponse(
            object="list",
            data=data,
            first_id=ids[0] if ids else "",
            last_id=ids[-1] if ids else "",
            has_more=page["has_more"] or cut,
        )

    async def CancelResponse(
        self, request: pb.CancelResponseRequest, context: Context
    ) -> pb.CancelResponseResponse:
        """Cancel an in-flight response by id."""
        tenant = self._caller(context).tenant
        response = await self.one_shot.cancel_response(request.response_id, tenant)
        return pb.CancelResponseResponse(response=ProtoEncoder().response_to_pb(response))

    async def GetStats(self, request: pb.GetStatsRequest, context: Context) -> pb.GetStatsResponse:
        """Cumulative counters."""
        self._caller(context)
        return pb.GetStatsResponse(**self.one_shot.stats())

    async def CompactResponse(
        self, request: pb.CompactResponseRequest, context: Context
    ) -> pb.CompactResponseResponse:
        """Compact a conversation (``POST /v1/responses/compact``)."""
        body: JSONObject = {
            "model": request.model,
            "input": [item_to_dict(i) for i in request.input],
        }
        for name in ("instructions", "previous_response_id", "safety_identifier"):
            if request.HasField(name):
                body[name] = getattr(request, name)
        caller = self._caller(context)
        result = await self.one_shot.compact(body, self.core.naming.one_shot, caller)
        compacted = pb.CompactResponseResponse(
            id=result["id"],
            object=result["object"],
            created_at=result["created_at"],
            output=[item_to_pb(i) for i in result["output"]],
            usage=usage_to_pb(result["usage"]),
            service_tier=result["service_tier"],
        )
        if result["safety_identifier"] is not None:
            compacted.safety_identifier = result["safety_identifier"]
        return compacted

    async def CountInputTokens(
        self, request: pb.CountInputTokensRequest, context: Context
    ) -> pb.CountInputTokensResponse:
        """Count a create's prompt tokens (``POST /v1/responses/input_tokens``)."""
        tenant = self._caller(context).tenant
        body = ProtoDecoder().params_to_dict(request.params)
        count = await self.one_shot.count_input_tokens(body, tenant)
        return pb.CountInputTokensResponse(**count)

    async def ListModels(
        self, request: pb.ListModelsRequest, context: Context
    ) -> pb.ListModelsResponse:
        """The configured models (``GET /v1/models``)."""
        self._caller(context)
        listing = self.one_shot.list_models()
        return pb.ListModelsResponse(
            object=listing["object"], data=[pb.Model(**m) for m in listing["data"]]
        )

    async def GetModel(self, request: pb.GetModelRequest, context: Context) -> pb.GetModelResponse:
        """One configured model (``GET /v1/models/{model}``)."""
        self._caller(context)
        return pb.GetModelResponse(model=pb.Model(**self.one_shot.get_model(request.model)))

    async def StreamResponse(
        self, request: pb.StreamResponseRequest, context: Context
    ) -> AsyncGenerator[pb.StreamResponseResponse, None]:
        """Resume a background response's events after ``starting_after``."""
        tenant = self._caller(context).tenant
        starting_after = request.starting_after if request.HasField("starting_after") else -1
        if starting_after < -1:
            raise ApiError("Invalid 'starting_after': expected >= 0.", param="starting_after")
        events = self.one_shot.background_events(request.response_id, starting_after, tenant)
        encoder = ProtoEncoder()
        async for data in events:
            yield pb.StreamResponseResponse(event=encoder.connect_response("", data))


#: The most bytes of items one ``ListInputItems`` page carries: under the 4 MiB that stock
#: gRPC clients accept per message (with room for the envelope), so that a default page of
#: large items is never refused by the client (the page is shorter, ``has_more`` set, and the
#: next page starts after its ``last_id``). One item larger than this still goes alone.
PAGE_BYTES = 3 * 1024 * 1024


def _within_page_bytes(items: list[pb.Item]) -> list[pb.Item]:
    """The leading ``items`` that fit ``PAGE_BYTES`` (at least one)."""
    total = 0
    for count, item in enumerate(items):
        total += item.ByteSize()
        if total > PAGE_BYTES and count > 0:
            return items[:count]
    return items
