"""The gRPC plumbing the client's calls share: channel options, the delivery options a client
asks for, stubs whose replies may nest deeply, and a non-OK status as a ``ResponsesError``."""

from __future__ import annotations

import functools

import grpc
from bidi_responses.codec import decode_message
from bidi_responses.v1 import responses_pb2 as pb
from bidi_responses.v1 import responses_pb2_grpc as pb_grpc

from .types import ResponsesError

__all__ = [
    "CHANNEL_OPTIONS",
    "ConnectCall",
    "accept_deep_replies",
    "delivery_options",
    "status_error",
]

_MAX_MESSAGE = 64 * 1024 * 1024
#: Options of the channels the client opens: messages up to 64 MiB each way.
CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
    ("grpc.max_send_message_length", _MAX_MESSAGE),
)

#: One Connect call on the typed stub (mypy-protobuf).
ConnectCall = grpc.aio.StreamStreamCall[pb.ConnectRequest, pb.ConnectResponse]

#: The delta window this client asks for unless told otherwise (``DeliveryOptions``). An agent
#: loop reads whole items, and a reader of the text sees 50 updates a second; one message per
#: 20 ms instead of one per two tokens saves most of a stream's per-message cost on both sides.
#: An item's first delta and its end are never held, so time to first token is unchanged; but a
#: turn's last events then follow a pause, and a message after a pause wakes sleeping threads
#: (~0.6 ms more on a small turn on a 2-vCPU VM). ``delta_window_ms=0`` trades CPU for that.
DEFAULT_DELTA_WINDOW_MS = 20


_SNAPSHOT_DETAIL = {"full": pb.SNAPSHOT_DETAIL_FULL, "slim": pb.SNAPSHOT_DETAIL_SLIM}


def delivery_options(
    *,
    batch_events: bool,
    snapshots: str,
    json_tool_schemas: bool = True,
    delta_window_ms: int = DEFAULT_DELTA_WINDOW_MS,
) -> pb.DeliveryOptions:
    """The ``DeliveryOptions`` this client asks for (``snapshots``: "full" or "slim";
    ``delta_window_ms`` 0: the server's window, one delta per token or two)."""
    if snapshots not in _SNAPSHOT_DETAIL:
        raise ValueError(f"snapshots must be 'full' or 'slim', not {snapshots!r}")
    return pb.DeliveryOptions(
        batch_events=batch_events,
        snapshot_detail=_SNAPSHOT_DETAIL[snapshots],
        tool_parameters_json=json_tool_schemas,
        delta_window_ms=delta_window_ms,
    )


def status_error(error: grpc.aio.AioRpcError) -> ResponsesError:
    """A non-OK status as the error the client raises (the server's own code when it sent one)."""
    metadata = dict(error.trailing_metadata() or ())
    code = metadata.get("error-code")
    return ResponsesError(
        str(code) if code else error.code().name.lower(),
        error.details() or "",
        str(metadata.get("error-param") or "") or None,
    )


def accept_deep_replies(stub: pb_grpc.ResponsesServiceStub, channel: grpc.aio.Channel) -> None:
    """Replace the stub's calls with ones whose replies may nest past protobuf's default of
    100 levels: the server echoes tool schemas (Structs) as deep as it accepts them."""
    service = pb.DESCRIPTOR.services_by_name["ResponsesService"]
    for method in service.methods:
        request_class = getattr(pb, method.input_type.name)
        reply_class = getattr(pb, method.output_type.name)
        path = f"/{service.full_name}/{method.name}"
        kind = (
            channel.stream_stream
            if method.client_streaming
            else channel.unary_stream
            if method.server_streaming
            else channel.unary_unary
        )
        setattr(
            stub,
            method.name,
            kind(
                path,
                request_serializer=request_class.SerializeToString,
                response_deserializer=functools.partial(decode_message, reply_class),
            ),
        )
