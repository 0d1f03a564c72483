"""The request decoder: ``ConnectRequest`` -> the WebSocket-mode client event, and the tools'
bytes of a create.

The server's Connect turns a request straight into the core's typed client event
(``server/transports/grpc/connect_events.py``, with this package's item and params converters);
``client_event`` is the JSON form of the same message, which the codec's tests and benchmarks
compare against.

A stream sends the same tools every turn: each tool is converted once while it stays in
``codec.tools``' cache, found by its bytes, which ``tool_keys`` reads out of the request as it
arrived (a second parse that keeps each tool as bytes, far cheaper than serializing the tools
again). The core then reuses the lane's ``ToolSet`` when the list has the same fingerprint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bidi_responses.schema import JSONObject
from bidi_responses.v1 import responses_pb2 as pb
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

from .injection import inject_to_dict
from .items import item_to_dict
from .params import params_to_dict
from .steering import steer_to_dict
from .wire import field_number


def _tool_bytes_classes() -> tuple[type[Message], type[Message]]:
    """Messages read from ``ConnectRequest`` and ``CreateResponseRequest`` bytes that keep
    only the create's tools, each as the bytes of its ``Tool`` message (a message field and a
    bytes field share a wire form); the parameters are ``create`` in both. Built at run time
    in a private pool: nothing is added to the API."""
    file = descriptor_pb2.FileDescriptorProto(
        name="bidi_responses/codec/tool_bytes.proto",
        package="bidi_responses.codec.internal",
        syntax="proto3",
    )
    field = descriptor_pb2.FieldDescriptorProto
    params = file.message_type.add(name="CreateToolBytes")
    params.field.add(
        name="tools",
        number=field_number(pb.ResponseCreateParams, "tools"),
        type=field.TYPE_BYTES,
        label=field.LABEL_REPEATED,
    )
    containers = (
        ("ConnectRequestToolBytes", field_number(pb.ConnectRequest, "response_create")),
        ("CreateResponseRequestToolBytes", field_number(pb.CreateResponseRequest, "params")),
    )
    for name, number in containers:
        file.message_type.add(name=name).field.add(
            name="create",
            number=number,
            type=field.TYPE_MESSAGE,
            type_name=".bidi_responses.codec.internal.CreateToolBytes",
            label=field.LABEL_OPTIONAL,
        )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    connect, unary = (
        message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"bidi_responses.codec.internal.{name}")
        )
        for name, _ in containers
    )
    return connect, unary


_CONNECT_TOOL_BYTES, _UNARY_TOOL_BYTES = _tool_bytes_classes()


class ProtoDecoder:
    """Decodes the client messages of a stream into the core's JSON-shaped events."""

    @staticmethod
    def params_to_dict(
        params: pb.ResponseCreateParams, tool_keys: Sequence[bytes] | None = None
    ) -> JSONObject:
        """Create parameters as the POST /v1/responses body (absent fields left out); see
        ``client_event`` for ``tool_keys``."""
        return params_to_dict(params, tool_keys)

    @staticmethod
    def tool_keys(raw: bytes, *, unary: bool = False) -> tuple[bytes, ...] | None:
        """The serialized tools of the create in ``raw`` (a ``ConnectRequest`` that decoded,
        or with ``unary`` a ``CreateResponseRequest``), for ``client_event`` and
        ``params_to_dict``; None when it carries none. Copies of the tools' bytes only: the
        rest of the message is not kept."""
        try:
            message: Any = (_UNARY_TOOL_BYTES if unary else _CONNECT_TOOL_BYTES).FromString(raw)
        except DecodeError:
            return None
        return tuple(message.create.tools) or None

    @staticmethod
    def client_event(
        request: pb.ConnectRequest, tool_keys: Sequence[bytes] | None = None
    ) -> JSONObject:
        """A ConnectRequest as the WebSocket-mode client event (``{}`` when none is set);
        ``tool_keys`` (``tool_keys`` of the bytes ``request`` was read from) saves
        serializing the create's tools to find them in the cache."""
        kind = request.WhichOneof("event")
        event: JSONObject
        if kind == "response_create":
            event = params_to_dict(request.response_create, tool_keys)
            event["type"] = "response.create"
        elif kind == "response_append":
            event = {
                "type": "response.append",
                "response_id": request.response_append.response_id,
                "input": [item_to_dict(i) for i in request.response_append.input],
            }
        elif kind == "response_cancel":
            event = {"type": "response.cancel", "response_id": request.response_cancel.response_id}
        elif kind == "response_steer" or kind == "response_inject":
            # WebSocket mode's exact shape: the answers name the target, so no event_id; a
            # lane given on the envelope is passed on for the core to refuse, as it would be
            # over WebSocket (the target's lane is used).
            event = (
                steer_to_dict(request.response_steer)
                if kind == "response_steer"
                else inject_to_dict(request.response_inject)
            )
            if request.stream_id:
                event["stream_id"] = request.stream_id
            return event
        else:
            event = {}
        if request.stream_id:
            event["stream_id"] = request.stream_id
        if request.event_id:
            event["event_id"] = request.event_id
        return event
