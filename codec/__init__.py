"""The JSON <-> protobuf mapping of the API, shared by the server and the client.

Field names are identical on both sides; the only real translation is that JSON's ``type``
discriminator is a protobuf ``oneof`` case. The mapping is written out by hand: it runs for
every streamed event, and explicit constructors cost a fraction of ``json_format``.

One module per concept, each converting both ways (``X_to_pb`` from JSON, ``X_to_dict`` back):
``structs`` (free JSON), ``items``, ``tools``, ``settings`` (text, reasoning, usage, stats),
``params`` (create parameters), ``responses``, ``steering`` and ``injection`` (the requests
and their acknowledgements); and per direction of the stream:
``request_decoder`` (the server's), ``event_encoder`` (the server's, writing a turn's events
by hand with ``turn_bytes``, their items and snapshots with ``item_bytes`` and
``response_bytes``, over ``proto3_fields``), ``event_decoder`` (the client's), over ``events``
(the event table both share), ``wire`` (framing by hand) and ``depth`` (nesting limits). Both sides'
event loops also share ``aio_wakeups``: grpc.aio's completion wake-ups, drained.
"""

from bidi_responses.schema import JSONObject, JSONValue

from .depth import (
    API_MAX_DEPTH,
    PROTOBUF_DEFAULT_DEPTH,
    MessageDecodeError,
    decode_message,
    deep_messages,
    wire_problem,
)
from .event_decoder import EventDecoder
from .event_encoder import ProtoEncoder
from .injection import inject_to_dict, inject_to_pb
from .items import (
    canonical_item,
    checked_item_to_dict,
    function_call_to_dict,
    function_call_to_pb,
    item_to_dict,
    item_to_pb,
    part_to_dict,
    part_to_pb,
)
from .params import OPTIONAL_PARAMS, params_to_dict, params_to_pb
from .request_decoder import ProtoDecoder
from .responses import response_to_dict, response_to_pb
from .settings import (
    flat_message_to_dict,
    reasoning_to_dict,
    reasoning_to_pb,
    stats_to_dict,
    stats_to_pb,
    text_to_dict,
    text_to_pb,
    usage_to_dict,
    usage_to_pb,
)
from .steering import input_items_to_pb, steer_to_dict, steer_to_pb
from .structs import dict_to_struct, restore_integers, struct_to_dict
from .tools import (
    ProtoTools,
    tool_choice_to_dict,
    tool_choice_to_pb,
    tool_to_dict,
    tool_to_pb,
    tools_to_pb,
)
from .wire import (
    EVENT_FIELD,
    batch_bytes,
    batch_messages,
    field_bytes,
    unbatch,
    wire_bytes,
)

__all__ = [
    "API_MAX_DEPTH",
    "EVENT_FIELD",
    "OPTIONAL_PARAMS",
    "PROTOBUF_DEFAULT_DEPTH",
    "EventDecoder",
    "JSONObject",
    "JSONValue",
    "MessageDecodeError",
    "ProtoDecoder",
    "ProtoEncoder",
    "ProtoTools",
    "batch_bytes",
    "batch_messages",
    "canonical_item",
    "checked_item_to_dict",
    "decode_message",
    "deep_messages",
    "dict_to_struct",
    "field_bytes",
    "flat_message_to_dict",
    "function_call_to_dict",
    "function_call_to_pb",
    "inject_to_dict",
    "inject_to_pb",
    "input_items_to_pb",
    "item_to_dict",
    "item_to_pb",
    "params_to_dict",
    "params_to_pb",
    "part_to_dict",
    "part_to_pb",
    "reasoning_to_dict",
    "reasoning_to_pb",
    "response_to_dict",
    "response_to_pb",
    "restore_integers",
    "stats_to_dict",
    "stats_to_pb",
    "steer_to_dict",
    "steer_to_pb",
    "struct_to_dict",
    "text_to_dict",
    "text_to_pb",
    "tool_choice_to_dict",
    "tool_choice_to_pb",
    "tool_to_dict",
    "tool_to_pb",
    "tools_to_pb",
    "unbatch",
    "usage_to_dict",
    "usage_to_pb",
    "wire_bytes",
    "wire_problem",
]
