"""The JSON <-> protobuf mapping of the API, shared by the server and the client.

Field names are identical on both sides; the only real translation is that JSON's ``type``
discriminator is a protobuf ``oneof`` case (``"function_call"`` <-> ``Item.function_call``,
``"response.output_text.delta"`` <-> ``ConnectResponse.response_output_text_delta``).

The mapping is written out by hand: it runs for every streamed event, and explicit
constructors cost a fraction of ``json_format``. Tool definitions are the one bulky part that
repeats every turn, so decoder and encoder each keep a small memo of the last tools they saw.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable, Iterator
from typing import Any, Literal, ParamSpec, TypeVar, get_args

from google.protobuf import message, struct_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from bidi_responses.v1 import responses_pb2 as pb

_M = TypeVar("_M", bound=message.Message)
_P = ParamSpec("_P")
_R = TypeVar("_R")

_set_allow_oversize: Callable[[bool], None] | None
try:  # upb: lifts the parse depth limit process-wide; deep_messages sets it around one use
    from google._upb._message import SetAllowOversizeProtos as _set_allow_oversize
except ImportError:  # another protobuf implementation: deep messages are refused
    _set_allow_oversize = None


# -- decoding (client -> core) -------------------------------------------------------------


def struct_to_dict(struct: struct_pb2.Struct) -> dict[str, Any]:
    """A Struct as a plain dict (integers that were sent as JSON numbers stay floats).

    Written out rather than ``json_format.MessageToDict``, which raises on NaN and infinite
    numbers: those reach the core as floats, and the core refuses them with a 400 naming the
    field, as it does for every transport.
    """
    return {key: _value_to_py(value) for key, value in struct.fields.items()}


def _value_to_py(value: struct_pb2.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "number_value":
        return value.number_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return struct_to_dict(value.struct_value)
    if kind == "list_value":
        return [_value_to_py(v) for v in value.list_value.values]
    return None


# -- decoding raw messages -------------------------------------------------------------------

#: protobuf's default nesting limit for parsing (upb, C++, Java): messages within messages.
PROTOBUF_DEFAULT_DEPTH = 100
#: The nesting this API accepts: a Struct spends three message levels per JSON object (the
#: Struct, its map entry, the Value), so JSON nested 64 levels (the core's limit) needs ~200.
API_MAX_DEPTH = 3 * 64 + 16


_deep_active = False


@contextlib.contextmanager
def deep_messages() -> Iterator[None]:
    """Lift protobuf's depth limit while building messages from checked data.

    upb copies a sub-message (``Outer(inner=msg)``, ``CopyFrom``) by serializing and parsing
    it, and that parse stops at 100 levels, so composing messages that hold deep tool schemas
    fails without this. Synchronous and re-entrant; decoding untrusted bytes never runs inside
    it (``decode_message`` applies its own bound first).
    """
    global _deep_active
    if _deep_active or _set_allow_oversize is None:
        yield
        return
    _deep_active = True
    _set_allow_oversize(True)
    try:
        yield
    finally:
        _set_allow_oversize(False)
        _deep_active = False


def _deep(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``fn`` inside ``deep_messages``."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with deep_messages():
            return fn(*args, **kwargs)

    return wrapper


class MessageDecodeError(ValueError):
    """A message that cannot be decoded; ``param`` names the field when it is known."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def decode_message(cls: type[_M], data: bytes, *, max_depth: int = API_MAX_DEPTH) -> _M:
    """Parse ``data`` as ``cls``, accepting nesting up to ``max_depth`` message levels.

    protobuf parses at most 100 levels, which a deep tool schema in a Struct exceeds. Only a
    message that fails the ordinary parse is walked (iteratively, in Python) to find out why:
    invalid UTF-8 in a string field or nesting beyond ``max_depth`` is reported with the field's
    path; nesting within ``max_depth`` is parsed again with the depth limit lifted.
    """
    try:
        return cls.FromString(data)
    except message.DecodeError:
        pass
    problem = wire_problem(data, cls.DESCRIPTOR, max_depth)
    if problem is not None:
        raise MessageDecodeError(*problem)
    if _set_allow_oversize is not None:
        try:
            with deep_messages():
                return cls.FromString(data)
        except message.DecodeError:
            pass
    raise MessageDecodeError(f"The message could not be decoded as {cls.DESCRIPTOR.full_name}.")


def wire_problem(data: bytes, descriptor: Any, max_depth: int) -> tuple[str, str | None] | None:
    """Why ``data`` is not a valid ``descriptor`` message within ``max_depth`` levels, if it can
    tell: ``(message, field path)``; None when the structure looks valid.

    Iterative: a hostile message cannot exhaust the stack while it is checked.
    """
    # (descriptor, end offset, depth, path) of each open message; pos is shared.
    stack: list[tuple[Descriptor, int, int, str]] = [(descriptor, len(data), 1, "")]
    pos = 0
    while stack:
        desc, end, depth, path = stack[-1]
        if pos >= end:
            stack.pop()
            continue
        try:
            tag, pos = _read_varint(data, pos)
            number, wire_type = tag >> 3, tag & 7
            if wire_type == 0:
                _, pos = _read_varint(data, pos)
            elif wire_type == 1:
                pos += 8
            elif wire_type == 5:
                pos += 4
            elif wire_type == 2:
                length, pos = _read_varint(data, pos)
                start, pos = pos, pos + length
                if pos > end:
                    return "The message is truncated.", path or None
                field = desc.fields_by_number.get(number)
                if field is None:
                    continue
                where = f"{path}.{field.name}" if path else field.name
                if len(where) > 256:  # deep paths repeat themselves: keep both ends
                    where = where[:120] + "..." + where[-120:]
                if field.message_type is not None:
                    if depth + 1 > max_depth:
                        return (
                            f"Invalid '{where}': messages may nest at most {max_depth} levels "
                            "(JSON values at most 64).",
                            where,
                        )
                    stack.append((field.message_type, pos, depth + 1, where))
                    pos = start
                elif field.type == FieldDescriptor.TYPE_STRING:
                    try:
                        data[start:pos].decode("utf-8")
                    except UnicodeDecodeError:
                        return f"Invalid '{where}': the string is not valid UTF-8.", where
            else:
                return "The message is not valid protobuf (bad wire type).", path or None
        except IndexError:
            return "The message is truncated.", path or None
        if pos > end:
            return "The message is truncated.", path or None
    return None


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


def _part_to_dict(part: pb.ContentPart) -> dict[str, Any]:
    kind = part.WhichOneof("part")
    if kind == "input_text":
        return {"type": "input_text", "text": part.input_text.text}
    if kind == "output_text":
        return {
            "type": "output_text",
            "text": part.output_text.text,
            "annotations": [struct_to_dict(a) for a in part.output_text.annotations],
        }
    if kind == "refusal":
        return {"type": "refusal", "refusal": part.refusal.refusal}
    if kind == "input_image":
        return {
            "type": "input_image",
            "image_url": part.input_image.image_url,
            "detail": part.input_image.detail or "auto",
        }
    return {}


def item_to_dict(item: pb.Item) -> dict[str, Any]:
    """An Item message as the JSON item (an unset oneof gives ``{}``, rejected by the core)."""
    kind = item.WhichOneof("item")
    result: dict[str, Any]
    if kind == "message":
        m = item.message
        result = {
            "type": "message",
            "role": m.role,
            "content": [_part_to_dict(p) for p in m.content],
        }
        if m.id:
            result["id"] = m.id
        if m.status:
            result["status"] = m.status
        if m.phase:
            result["phase"] = m.phase
        return result
    if kind == "function_call":
        f = item.function_call
        result = {
            "type": "function_call",
            "call_id": f.call_id,
            "name": f.name,
            "arguments": f.arguments,
        }
        if f.id:
            result["id"] = f.id
        if f.status:
            result["status"] = f.status
        return result
    if kind == "function_call_output":
        o = item.function_call_output
        result = {"type": "function_call_output", "call_id": o.call_id, "output": o.output}
        if o.id:
            result["id"] = o.id
        if o.status:
            result["status"] = o.status
        return result
    if kind == "reasoning":
        r = item.reasoning
        result = {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": s.text} for s in r.summary],
        }
        if r.id:
            result["id"] = r.id
        if r.encrypted_content:
            result["encrypted_content"] = r.encrypted_content
        return result
    if kind == "compaction":
        c = item.compaction
        result = {"type": "compaction", "encrypted_content": c.encrypted_content}
        if c.id:
            result["id"] = c.id
        if c.created_by:
            result["created_by"] = c.created_by
        return result
    if kind == "other":
        return struct_to_dict(item.other)
    return {}


def canonical(value: Any) -> Any:
    """JSON from a Struct with its integers back (Struct keeps every number as a double)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {key: canonical(item) for key, item in value.items()}
    if isinstance(value, list):
        return [canonical(item) for item in value]
    return value


def text_to_dict(text: pb.TextConfig) -> dict[str, Any]:
    """A TextConfig as the JSON ``text`` object (as the server echoes it)."""
    result: dict[str, Any] = {"format": {"type": "text"}}
    if text.HasField("format"):
        f = text.format
        fmt: dict[str, Any] = {"type": f.type or "text"}
        if f.type == "json_schema":
            if f.name:
                fmt["name"] = f.name
            if f.HasField("schema"):
                fmt["schema"] = canonical(struct_to_dict(f.schema))
            if f.HasField("description"):
                fmt["description"] = f.description
            fmt["strict"] = f.strict if f.HasField("strict") else None
        result["format"] = fmt
    if text.HasField("verbosity"):
        result["verbosity"] = text.verbosity
    return result


def reasoning_to_dict(reasoning: pb.ReasoningConfig) -> dict[str, Any]:
    """A ReasoningConfig as the JSON ``reasoning`` object."""
    return {
        "effort": reasoning.effort if reasoning.HasField("effort") else None,
        "summary": reasoning.summary if reasoning.HasField("summary") else None,
    }


def text_to_pb(text: dict[str, Any]) -> pb.TextConfig:
    """The JSON ``text`` object as a TextConfig."""
    config = pb.TextConfig()
    fmt = text.get("format")
    if isinstance(fmt, dict):
        config.format.type = str(fmt.get("type") or "")
        if fmt.get("name") is not None:
            config.format.name = str(fmt["name"])
        if fmt.get("description") is not None:
            config.format.description = str(fmt["description"])
        if isinstance(fmt.get("schema"), dict):
            config.format.schema.update(fmt["schema"])
        if fmt.get("strict") is not None:
            config.format.strict = bool(fmt["strict"])
    if text.get("verbosity") is not None:
        config.verbosity = str(text["verbosity"])
    return config


def reasoning_to_pb(reasoning: dict[str, Any]) -> pb.ReasoningConfig:
    """The JSON ``reasoning`` object as a ReasoningConfig."""
    config = pb.ReasoningConfig()
    for key in ("effort", "summary"):
        if reasoning.get(key) is not None:
            setattr(config, key, str(reasoning[key]))
    return config


def tool_to_dict(tool: pb.Tool) -> dict[str, Any]:
    """A Tool message as the JSON tool."""
    kind = tool.WhichOneof("tool")
    if kind == "function":
        f = tool.function
        result: dict[str, Any] = {"type": "function", "name": f.name}
        if f.HasField("description"):
            result["description"] = f.description
        if f.HasField("parameters"):
            result["parameters"] = struct_to_dict(f.parameters)
        if f.HasField("strict"):
            result["strict"] = f.strict
        return result
    if kind == "other":
        return struct_to_dict(tool.other)
    return {}


# The optional scalar fields of ResponseCreateParams: present in JSON iff set in protobuf.
OptionalParam = Literal[
    "instructions",
    "previous_response_id",
    "store",
    "max_output_tokens",
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "generate",
    "append_mode",
    "safety_identifier",
    "prompt_cache_key",
    "user",
    "truncation",
    "max_tool_calls",
    "background",
    "idempotency_key",
]
OPTIONAL_PARAMS: tuple[OptionalParam, ...] = get_args(OptionalParam)


class ProtoDecoder:
    """Decodes client messages of one stream; remembers the last tools it converted."""

    def __init__(self) -> None:
        self._tools_key: bytes | None = None
        self._tools: list[dict[str, Any]] = []

    def _tools_of(self, tools: Any) -> list[dict[str, Any]]:
        key = b"\x00".join(t.SerializeToString() for t in tools)
        if key != self._tools_key:
            self._tools = [tool_to_dict(t) for t in tools]
            self._tools_key = key
        return self._tools

    def params_to_dict(self, params: pb.ResponseCreateParams) -> dict[str, Any]:
        """Create parameters as the POST /v1/responses body (absent fields left out)."""
        body: dict[str, Any] = {
            "model": params.model,
            "input": [item_to_dict(i) for i in params.input],
        }
        if params.tools:
            body["tools"] = self._tools_of(params.tools)
        if params.HasField("tool_choice"):
            choice = params.tool_choice
            which = choice.WhichOneof("choice")
            if which == "mode":
                body["tool_choice"] = choice.mode
            elif which == "function":
                body["tool_choice"] = {"type": "function", "name": choice.function.name}
        for name in OPTIONAL_PARAMS:
            if params.HasField(name):
                body[name] = getattr(params, name)
        if params.metadata:
            body["metadata"] = dict(params.metadata)
        if params.HasField("text"):
            body["text"] = text_to_dict(params.text)
        if params.HasField("reasoning"):
            body["reasoning"] = reasoning_to_dict(params.reasoning)
        if params.include:
            body["include"] = list(params.include)
        return body

    def client_event(self, request: pb.ConnectRequest) -> dict[str, Any]:
        """A ConnectRequest as the WebSocket-mode client event."""
        kind = request.WhichOneof("event")
        event: dict[str, Any]
        if kind == "response_create":
            event = self.params_to_dict(request.response_create)
            event["type"] = "response.create"
        elif kind == "response_append":
            event = {
                "type": "response.append",
                "response_id": request.response_append.response_id,
                "input": [item_to_dict(i) for i in request.response_append.input],
            }
        elif kind == "response_cancel":
            event = {"type": "response.cancel", "response_id": request.response_cancel.response_id}
        else:
            event = {}
        if request.stream_id:
            event["stream_id"] = request.stream_id
        if request.event_id:
            event["event_id"] = request.event_id
        return event


# -- encoding (core -> client) -------------------------------------------------------------


@_deep
def dict_to_struct(value: dict[str, Any]) -> struct_pb2.Struct:
    """A plain dict as a Struct.

    Filled in place, level by level: ``Struct.update`` copies nested values through a parse
    that stops at protobuf's default depth, and tool schemas nest deeper than that.
    """
    struct = struct_pb2.Struct()
    _fill_struct(struct, value)
    return struct


def _fill_struct(struct: struct_pb2.Struct, value: dict[str, Any]) -> None:
    fields = struct.fields
    for key, item in value.items():
        _fill_value(fields[key], item)


def _fill_value(target: struct_pb2.Value, value: Any) -> None:
    if value is None:
        target.null_value = struct_pb2.NULL_VALUE
    elif isinstance(value, bool):
        target.bool_value = value
    elif isinstance(value, int | float):
        target.number_value = value
    elif isinstance(value, str):
        target.string_value = value
    elif isinstance(value, dict):
        target.struct_value.SetInParent()
        _fill_struct(target.struct_value, value)
    elif isinstance(value, list | tuple):
        values = target.list_value
        values.SetInParent()
        for item in value:
            _fill_value(values.values.add(), item)
    else:
        raise TypeError(f"cannot put a {type(value).__name__} in a protobuf Struct")


@_deep
def part_to_pb(part: dict[str, Any]) -> pb.ContentPart:
    """A JSON content part as a ContentPart."""
    kind = part.get("type")
    if kind == "output_text":
        return pb.ContentPart(
            output_text=pb.OutputText(
                text=part.get("text", ""),
                annotations=[dict_to_struct(a) for a in part.get("annotations") or ()],
            )
        )
    if kind == "input_text":
        return pb.ContentPart(input_text=pb.InputText(text=part.get("text", "")))
    if kind == "refusal":
        return pb.ContentPart(refusal=pb.Refusal(refusal=part.get("refusal", "")))
    if kind == "input_image":
        return pb.ContentPart(
            input_image=pb.InputImage(
                image_url=part.get("image_url", ""), detail=part.get("detail") or ""
            )
        )
    return pb.ContentPart()


def function_call_to_pb(item: dict[str, Any]) -> pb.FunctionCallItem:
    """A JSON function_call item as a FunctionCallItem."""
    return pb.FunctionCallItem(
        id=item.get("id", ""),
        call_id=item["call_id"],
        name=item["name"],
        arguments=item["arguments"],
        status=item.get("status", ""),
    )


@_deep
def item_to_pb(item: dict[str, Any]) -> pb.Item:
    """A JSON item as an Item (kinds without a typed case travel as ``other``)."""
    kind = item.get("type")
    if kind == "message":
        return pb.Item(
            message=pb.MessageItem(
                id=item.get("id", ""),
                role=item["role"],
                content=[part_to_pb(p) for p in item["content"]],
                status=item.get("status", ""),
                phase=item.get("phase") or "",
            )
        )
    if kind == "function_call":
        return pb.Item(function_call=function_call_to_pb(item))
    if kind == "function_call_output":
        return pb.Item(
            function_call_output=pb.FunctionCallOutputItem(
                id=item.get("id", ""),
                call_id=item["call_id"],
                output=item["output"],
                status=item.get("status", ""),
            )
        )
    if kind == "compaction":
        return pb.Item(
            compaction=pb.CompactionItem(
                id=item.get("id") or "",
                encrypted_content=item.get("encrypted_content") or "",
                created_by=item.get("created_by") or "",
            )
        )
    if kind == "reasoning":
        return pb.Item(
            reasoning=pb.ReasoningItem(
                id=item.get("id", ""),
                summary=[
                    pb.ReasoningSummary(type="summary_text", text=s["text"])
                    for s in item.get("summary", ())
                ],
                encrypted_content=item.get("encrypted_content") or "",
                status=item.get("status", ""),
            )
        )
    return pb.Item(other=dict_to_struct(item))


@_deep
def tool_to_pb(tool: dict[str, Any]) -> pb.Tool:
    """A JSON tool as a Tool."""
    if tool.get("type") == "function":
        function = pb.FunctionTool(name=tool["name"])
        if tool.get("description") is not None:
            function.description = tool["description"]
        if tool.get("parameters") is not None:
            function.parameters.update(tool["parameters"])
        if tool.get("strict") is not None:
            function.strict = tool["strict"]
        return pb.Tool(function=function)
    return pb.Tool(other=dict_to_struct(tool))


def _tool_choice_to_pb(choice: Any) -> pb.ToolChoice:
    if isinstance(choice, dict):
        return pb.ToolChoice(function=pb.FunctionToolChoice(name=choice.get("name", "")))
    return pb.ToolChoice(mode=str(choice))


def _usage_to_pb(usage: dict[str, Any]) -> pb.Usage:
    return pb.Usage(
        input_tokens=usage["input_tokens"],
        input_tokens_details=pb.InputTokensDetails(
            cached_tokens=usage["input_tokens_details"]["cached_tokens"]
        ),
        output_tokens=usage["output_tokens"],
        output_tokens_details=pb.OutputTokensDetails(
            reasoning_tokens=usage["output_tokens_details"]["reasoning_tokens"]
        ),
        total_tokens=usage["total_tokens"],
    )


def usage_to_pb(usage: dict[str, Any]) -> pb.Usage:
    """The JSON ``usage`` object as a Usage."""
    return _usage_to_pb(usage)


def usage_to_dict(u: pb.Usage) -> dict[str, Any]:
    """A Usage as the JSON ``usage`` object."""
    return {
        "input_tokens": u.input_tokens,
        "input_tokens_details": {"cached_tokens": u.input_tokens_details.cached_tokens},
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": u.output_tokens_details.reasoning_tokens},
        "total_tokens": u.total_tokens,
    }


def stats_to_pb(stats: dict[str, Any]) -> pb.ResponseStats:
    """The server's per-response counters."""
    return pb.ResponseStats(**stats)


# -- wire encoding by hand, for the hot path ------------------------------------------------
#
# A serialized message is its fields' encodings in any order, and a message field is its tag,
# its length and the sub-message's bytes. So the streaming path builds bytes, not messages:
# a batch is the events' bytes framed as ``EventBatch.events`` (no copy of each event into a
# container message), and a snapshot's request echo (tools, instructions, sampling settings)
# is serialized once per response instead of once per snapshot. The gRPC transport sends
# these bytes as they are; any protobuf parser reads them as the same messages.


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field_bytes(number: int, payload: bytes) -> bytes:
    """A length-delimited field (a sub-message or a string): tag, length, payload."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _number(message: Any, name: str) -> int:
    number: int = message.DESCRIPTOR.fields_by_name[name].number
    return number


_BATCH_FIELD = _number(pb.ConnectResponse, "batch")
_BATCH_EVENTS_FIELD = _number(pb.EventBatch, "events")
_STREAM_ID_FIELD = _number(pb.ConnectResponse, "stream_id")
_SNAPSHOT_RESPONSE_FIELD = _number(pb.ResponseSnapshotEvent, "response")
_SNAPSHOT_SEQUENCE = _varint(_number(pb.ResponseSnapshotEvent, "sequence_number") << 3 | 0)
EVENT_FIELD = _number(pb.CreateResponseResponse, "event")


def batch_bytes(events: list[bytes]) -> bytes:
    """Serialized ``ConnectResponse{batch: {events}}`` from serialized events."""
    return field_bytes(_BATCH_FIELD, b"".join(field_bytes(_BATCH_EVENTS_FIELD, e) for e in events))


def wire_bytes(message: Any) -> bytes:
    """The response serializer of the streaming calls: bytes pass through, messages are
    serialized."""
    if type(message) is bytes:
        return message
    data: bytes = message.SerializeToString()
    return data


class ProtoEncoder:
    """Encodes server events of one stream; remembers the last tools it converted.

    With ``slim``, snapshot events leave out the echoed instructions and tools
    (``SNAPSHOT_DETAIL_SLIM``).
    """

    def __init__(self, *, slim: bool = False) -> None:
        self.slim = slim
        self._tools_ref: Any = None
        self._tools_pb: list[pb.Tool] = []
        # Serialized request echo per in-flight response id (see ``event_bytes``).
        self._echo: dict[tuple[str, bool], bytes] = {}

    @_deep
    def event_bytes(self, lane: str, e: dict[str, Any]) -> bytes:
        """A core event as serialized ``ConnectResponse`` bytes (what ``connect_response``
        gives, serialized), building snapshots from a once-per-response request echo."""
        kind = e["type"]
        if kind not in _SNAPSHOT_EVENTS:
            return self.connect_response(lane, e).SerializeToString()
        r = e["response"]
        key = (r["id"], self.slim)
        echo = self._echo.get(key)
        if echo is None:
            if len(self._echo) >= 64:  # responses that never ended (cut-short streams)
                self._echo.clear()
            echo = self._echo[key] = self._echo_pb(r, self.slim).SerializeToString()
        if kind in _TERMINAL_SNAPSHOTS:
            del self._echo[key]
        response = self._progress_pb(r, self.slim).SerializeToString() + echo
        snapshot = field_bytes(_SNAPSHOT_RESPONSE_FIELD, response)
        seq = e.get("sequence_number", 0)
        if seq:
            snapshot += _SNAPSHOT_SEQUENCE + _varint(seq)
        out = field_bytes(_SNAPSHOT_FIELDS[kind], snapshot)
        if lane:
            out = field_bytes(_STREAM_ID_FIELD, lane.encode()) + out
        return out

    def _tools(self, tools: list[dict[str, Any]]) -> list[pb.Tool]:
        # The core hands out the same list object while a stream's tools are unchanged.
        if tools is not self._tools_ref:
            self._tools_pb = [tool_to_pb(t) for t in tools]
            self._tools_ref = tools
        return self._tools_pb

    @_deep
    def response_to_pb(self, r: dict[str, Any], *, slim: bool = False) -> pb.Response:
        """A Response object (``slim``: without the echoed instructions and tools)."""
        response = self._progress_pb(r, slim)
        response.MergeFrom(self._echo_pb(r, slim))
        return response

    def _echo_pb(self, r: dict[str, Any], slim: bool) -> pb.Response:
        """The fields that echo the request: the same in every snapshot of a response."""
        response = pb.Response(
            object="response",
            model=r["model"],
            tools=None if slim else self._tools(r["tools"]),
            tool_choice=_tool_choice_to_pb(r["tool_choice"]),
            truncation=r["truncation"],
            parallel_tool_calls=r["parallel_tool_calls"],
            temperature=r["temperature"],
            top_p=r["top_p"],
            store=r["store"],
            background=r["background"],
            service_tier=r["service_tier"],
            metadata=r["metadata"],
            presence_penalty=r["presence_penalty"],
            frequency_penalty=r["frequency_penalty"],
            top_logprobs=r["top_logprobs"],
        )
        if r.get("text"):
            response.text.CopyFrom(text_to_pb(r["text"]))
        if r.get("reasoning") is not None:
            response.reasoning.CopyFrom(reasoning_to_pb(r["reasoning"]))
        for name in _ECHO_FIELDS if slim else _ECHO_FIELDS_FULL:
            value = r.get(name)
            if value is not None:
                setattr(response, name, value)
        return response

    def _progress_pb(self, r: dict[str, Any], slim: bool) -> pb.Response:
        """The fields that change over a response's life."""
        response = pb.Response(
            id=r["id"],
            created_at=r["created_at"],
            status=r["status"],
            output=[item_to_pb(i) for i in r["output"]],
            slim=slim,
            safety_flags=[pb.SafetyFlag(**f) for f in r.get("safety_flags") or ()],
        )
        if r.get("completed_at") is not None:
            response.completed_at = r["completed_at"]
        if r.get("previous_response_id") is not None:
            response.previous_response_id = r["previous_response_id"]
        if r.get("incomplete_details"):
            response.incomplete_details.reason = r["incomplete_details"]["reason"]
        if r.get("error"):
            response.error.code = r["error"].get("code") or ""
            response.error.message = r["error"].get("message") or ""
        if r.get("usage"):
            response.usage.CopyFrom(_usage_to_pb(r["usage"]))
        if r.get("stats"):
            response.stats.CopyFrom(stats_to_pb(r["stats"]))
        return response

    @_deep
    def connect_response(self, lane: str, e: dict[str, Any]) -> pb.ConnectResponse:
        """A core event as a ConnectResponse."""
        kind = e["type"]
        seq = e.get("sequence_number", 0)
        if kind == "response.output_text.delta":
            return pb.ConnectResponse(
                stream_id=lane,
                response_output_text_delta=(
                    pb.OutputTextDeltaEvent(
                        item_id=e["item_id"],
                        output_index=e["output_index"],
                        content_index=e["content_index"],
                        delta=e["delta"],
                        sequence_number=seq,
                    )
                ),
            )
        if kind == "response.function_call_arguments.delta":
            return pb.ConnectResponse(
                stream_id=lane,
                response_function_call_arguments_delta=(
                    pb.FunctionCallArgumentsDeltaEvent(
                        item_id=e["item_id"],
                        output_index=e["output_index"],
                        delta=e["delta"],
                        sequence_number=seq,
                    )
                ),
            )
        case = kind.replace(".", "_")
        message: Any
        if kind in _SNAPSHOT_EVENTS:
            message = pb.ResponseSnapshotEvent(
                response=self.response_to_pb(e["response"], slim=self.slim), sequence_number=seq
            )
        elif kind in ("response.output_item.added", "response.output_item.done"):
            message = pb.OutputItemEvent(
                output_index=e["output_index"], item=item_to_pb(e["item"]), sequence_number=seq
            )
        elif kind in ("response.content_part.added", "response.content_part.done"):
            message = pb.ContentPartEvent(
                item_id=e["item_id"],
                output_index=e["output_index"],
                content_index=e["content_index"],
                part=part_to_pb(e["part"]),
                sequence_number=seq,
            )
        elif kind == "response.output_text.done":
            message = pb.OutputTextDoneEvent(
                item_id=e["item_id"],
                output_index=e["output_index"],
                content_index=e["content_index"],
                text=e["text"],
                sequence_number=seq,
            )
        elif kind == "response.function_call_arguments.done":
            message = pb.FunctionCallArgumentsDoneEvent(
                item_id=e["item_id"],
                output_index=e["output_index"],
                arguments=e["arguments"],
                name=e.get("name", ""),
                sequence_number=seq,
            )
        elif kind == "response.done":
            message = pb.ResponseDoneEvent(
                response=self.response_to_pb(e["response"], slim=self.slim),
                pending_calls=[function_call_to_pb(c) for c in e["pending_calls"]],
                sequence_number=seq,
            )
        elif kind == "error":
            err = e["error"]
            message = pb.ErrorEvent(
                status=e["status"],
                error=pb.ErrorDetail(
                    type=err.get("type") or "",
                    code=err.get("code") or "",
                    message=err.get("message") or "",
                    param=err.get("param") or "",
                    event_id=err.get("event_id") or "",
                    request_type=err.get("request_type") or "",
                    response_id=err.get("response_id") or "",
                ),
                sequence_number=seq,
            )
        elif kind == "warning":
            message = pb.WarningEvent(code=e["code"], message=e["message"])
        else:
            raise ValueError(f"no protobuf case for event type {kind!r}")
        return pb.ConnectResponse(stream_id=lane, **{case: message})


_ECHO_FIELDS = ("max_output_tokens", "safety_identifier", "prompt_cache_key", "max_tool_calls")
_ECHO_FIELDS_FULL = (*_ECHO_FIELDS, "instructions")


def batch_messages(events: list[bytes], max_events: int, max_bytes: int) -> list[bytes]:
    """Serialized events ready together as few messages, in order: ``batch`` messages of at
    most ``max_events`` events and about ``max_bytes`` (a larger event travels alone); a run
    of one event stays a plain single-event message."""
    out: list[bytes] = []
    run: list[bytes] = []
    size = 0
    for event in events:
        if run and (size + len(event) > max_bytes or len(run) >= max_events):
            out.append(run[0] if len(run) == 1 else batch_bytes(run))
            run, size = [], 0
        run.append(event)
        size += len(event)
    if run:
        out.append(run[0] if len(run) == 1 else batch_bytes(run))
    return out


def unbatch(message: pb.ConnectResponse) -> Any:
    """The events a message carries: the batch's events, or the message itself."""
    if message.WhichOneof("event") == "batch":
        return message.batch.events
    return (message,)


_SNAPSHOT_EVENTS = frozenset(
    {
        "response.created",
        "response.in_progress",
        "response.completed",
        "response.failed",
        "response.incomplete",
    }
)
_TERMINAL_SNAPSHOTS = frozenset({"response.completed", "response.failed", "response.incomplete"})
_SNAPSHOT_FIELDS = {
    kind: _number(pb.ConnectResponse, kind.replace(".", "_")) for kind in _SNAPSHOT_EVENTS
}


# -- decoding server events (client side) ---------------------------------------------------


def flat_message_to_dict(message: Any) -> dict[str, Any]:
    """A message of scalars and scalar maps as a dict with native numbers.

    (``json_format`` would turn 64-bit integers into strings, as proto3 JSON requires.)
    """
    result: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        result[field.name] = dict(value) if field.message_type is not None else value
    return result


def _opt(message: Any, name: str) -> Any:
    return getattr(message, name) if message.HasField(name) else None


class EventDecoder:
    """Decodes ConnectResponse messages into the JSON events a WebSocket client would see."""

    def __init__(self) -> None:
        self._tools_key: bytes | None = None
        self._tools: list[dict[str, Any]] = []

    def _tools_of(self, tools: Any) -> list[dict[str, Any]]:
        key = b"\x00".join(t.SerializeToString() for t in tools)
        if key != self._tools_key:
            self._tools = [_tool_echo(tool_to_dict(t)) for t in tools]
            self._tools_key = key
        return self._tools

    def response(self, r: pb.Response) -> dict[str, Any]:
        """A Response message as the JSON Response object."""
        choice = r.tool_choice
        tool_choice: Any = (
            {"type": "function", "name": choice.function.name}
            if choice.WhichOneof("choice") == "function"
            else (choice.mode or "auto")
        )
        usage = None
        if r.HasField("usage"):
            u = r.usage
            usage = {
                "input_tokens": u.input_tokens,
                "input_tokens_details": {"cached_tokens": u.input_tokens_details.cached_tokens},
                "output_tokens": u.output_tokens,
                "output_tokens_details": {
                    "reasoning_tokens": u.output_tokens_details.reasoning_tokens
                },
                "total_tokens": u.total_tokens,
            }
        result: dict[str, Any] = {
            "id": r.id,
            "object": r.object or "response",
            "created_at": r.created_at,
            "completed_at": _opt(r, "completed_at"),
            "status": r.status,
            "incomplete_details": (
                {"reason": r.incomplete_details.reason}
                if r.HasField("incomplete_details")
                else None
            ),
            "model": r.model,
            "previous_response_id": _opt(r, "previous_response_id"),
            "instructions": _opt(r, "instructions"),
            "output": [item_to_dict(i) for i in r.output],
            "error": (
                {"code": r.error.code, "message": r.error.message} if r.HasField("error") else None
            ),
            "tools": self._tools_of(r.tools),
            "tool_choice": tool_choice,
            "truncation": r.truncation,
            "parallel_tool_calls": r.parallel_tool_calls,
            "text": (text_to_dict(r.text) if r.HasField("text") else {"format": {"type": "text"}}),
            "top_p": r.top_p,
            "presence_penalty": r.presence_penalty,
            "frequency_penalty": r.frequency_penalty,
            "temperature": r.temperature,
            "top_logprobs": r.top_logprobs,
            "reasoning": reasoning_to_dict(r.reasoning) if r.HasField("reasoning") else None,
            "usage": usage,
            "max_output_tokens": _opt(r, "max_output_tokens"),
            "max_tool_calls": _opt(r, "max_tool_calls"),
            "store": r.store,
            "background": r.background,
            "service_tier": r.service_tier,
            "safety_identifier": _opt(r, "safety_identifier"),
            "prompt_cache_key": _opt(r, "prompt_cache_key"),
            "metadata": dict(r.metadata),
            "safety_flags": [
                {"classifier": f.classifier, "code": f.code, "param": f.param, "message": f.message}
                for f in r.safety_flags
            ],
        }
        if r.HasField("stats"):
            result["stats"] = flat_message_to_dict(r.stats)
        return result

    def event(self, message: pb.ConnectResponse) -> dict[str, Any]:
        """A ConnectResponse as the JSON event (``stream_id`` included when set)."""
        case = message.WhichOneof("event")
        if case is None:
            return {"type": "", "stream_id": message.stream_id}
        body = getattr(message, case)
        kind = case.replace("_", ".", 1) if case != "error" and case != "warning" else case
        kind = _EVENT_TYPES.get(case, kind)
        event: dict[str, Any]
        if case in ("response_output_text_delta",):
            event = {
                "type": kind,
                "item_id": body.item_id,
                "output_index": body.output_index,
                "content_index": body.content_index,
                "delta": body.delta,
            }
        elif case == "response_function_call_arguments_delta":
            event = {
                "type": kind,
                "item_id": body.item_id,
                "output_index": body.output_index,
                "delta": body.delta,
            }
        elif case in _SNAPSHOT_CASES:
            event = {"type": kind, "response": self.response(body.response)}
        elif case in ("response_output_item_added", "response_output_item_done"):
            event = {
                "type": kind,
                "output_index": body.output_index,
                "item": item_to_dict(body.item),
            }
        elif case in ("response_content_part_added", "response_content_part_done"):
            event = {
                "type": kind,
                "item_id": body.item_id,
                "output_index": body.output_index,
                "content_index": body.content_index,
                "part": _part_to_dict(body.part),
            }
        elif case == "response_output_text_done":
            event = {
                "type": kind,
                "item_id": body.item_id,
                "output_index": body.output_index,
                "content_index": body.content_index,
                "text": body.text,
            }
        elif case == "response_function_call_arguments_done":
            event = {
                "type": kind,
                "item_id": body.item_id,
                "output_index": body.output_index,
                "arguments": body.arguments,
                "name": body.name,
            }
        elif case == "response_done":
            event = {
                "type": kind,
                "response": self.response(body.response),
                "pending_calls": [
                    item_to_dict(pb.Item(function_call=c)) for c in body.pending_calls
                ],
            }
        elif case == "error":
            event = {
                "type": "error",
                "status": body.status,
                "error": {
                    "type": body.error.type,
                    "code": body.error.code or None,
                    "message": body.error.message,
                    "param": body.error.param or None,
                },
            }
            # Which request the error answers, only when known (as over WebSocket).
            for name in ("event_id", "request_type", "response_id"):
                value = getattr(body.error, name)
                if value:
                    event["error"][name] = value
            return _with_lane(event, message.stream_id)
        else:
            event = {"type": "warning", "code": body.code, "message": body.message}
            return _with_lane(event, message.stream_id)
        event["sequence_number"] = body.sequence_number
        return _with_lane(event, message.stream_id)


def _with_lane(event: dict[str, Any], lane: str) -> dict[str, Any]:
    if lane:
        event["stream_id"] = lane
    return event


def _tool_echo(tool: dict[str, Any]) -> dict[str, Any]:
    if tool.get("type") == "function":
        for key in ("description", "parameters", "strict"):
            tool.setdefault(key, None)
    return tool


_SNAPSHOT_CASES = frozenset(
    {
        "response_created",
        "response_in_progress",
        "response_completed",
        "response_failed",
        "response_incomplete",
    }
)

_EVENT_TYPES = {
    "response_created": "response.created",
    "response_in_progress": "response.in_progress",
    "response_output_item_added": "response.output_item.added",
    "response_output_item_done": "response.output_item.done",
    "response_content_part_added": "response.content_part.added",
    "response_content_part_done": "response.content_part.done",
    "response_output_text_delta": "response.output_text.delta",
    "response_output_text_done": "response.output_text.done",
    "response_function_call_arguments_delta": "response.function_call_arguments.delta",
    "response_function_call_arguments_done": "response.function_call_arguments.done",
    "response_completed": "response.completed",
    "response_failed": "response.failed",
    "response_incomplete": "response.incomplete",
    "response_done": "response.done",
}


@_deep
def params_to_pb(body: dict[str, Any]) -> pb.ResponseCreateParams:
    """A JSON create body as ResponseCreateParams (the client side of ``params_to_dict``)."""
    params = pb.ResponseCreateParams(model=body.get("model", ""))
    raw_input = body.get("input")
    if isinstance(raw_input, str):
        raw_input = [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": raw_input}],
            }
        ]
    for item in raw_input or ():
        params.input.append(item_to_pb(canonical_item(item)))
    tools = body.get("tools")
    if tools:
        params.tools.extend(_tools_to_pb(tools))
    if body.get("tool_choice") is not None:
        params.tool_choice.CopyFrom(_tool_choice_to_pb(body["tool_choice"]))
    for name in OPTIONAL_PARAMS:
        if body.get(name) is not None:
            setattr(params, name, body[name])
    for key, value in (body.get("metadata") or {}).items():
        params.metadata[key] = value
    if isinstance(body.get("text"), dict):
        params.text.CopyFrom(text_to_pb(body["text"]))
    if isinstance(body.get("reasoning"), dict):
        params.reasoning.CopyFrom(reasoning_to_pb(body["reasoning"]))
    if body.get("include"):
        params.include.extend(body["include"])
    return params


# The last tool list converted by params_to_pb and its messages. Agents send the same tools
# every turn, and converting their JSON schemas to Struct costs ~0.3 ms a turn; comparing the
# lists costs a few microseconds.
_last_tools: tuple[list[Any], list[pb.Tool]] | None = None


def _tools_to_pb(tools: Any) -> list[pb.Tool]:
    global _last_tools
    memo = _last_tools
    if memo is not None and memo[0] == tools:
        return memo[1]
    converted = [tool_to_pb(tool) for tool in tools]
    _last_tools = (copy.deepcopy(list(tools)), converted)
    return converted


def canonical_item(item: dict[str, Any]) -> dict[str, Any]:
    """Fill the shorthand forms JSON allows (``{"role","content":"text"}``)."""
    if item.get("type") is None and "role" in item:
        item = {"type": "message", **item}
    if item.get("type") == "message" and isinstance(item.get("content"), str):
        part_type = "output_text" if item.get("role") == "assistant" else "input_text"
        item = {**item, "content": [{"type": part_type, "text": item["content"]}]}
    return item
