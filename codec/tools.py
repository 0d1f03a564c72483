"""Tool definitions and ``tool_choice``: JSON <-> ``Tool`` / ``ToolChoice``.

Tool lists are the one bulky part of a request that repeats every turn, so each direction
converts a tool once while it stays in a small process-wide cache, found by its bytes before
any conversion: the server reading a create (``tools_to_dicts``), the client writing one
(``write_tools``) and reading the echo (``tool_echoes_to_dicts``). The server's ``ToolSet``
(one per distinct tool list) hands the encoder its protobuf form, built once
(``ProtoTools``). A function's schema travels as a Struct or, when a client asks, as JSON
text (``FunctionTool.parameters_json``), which wins when both are set.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import orjson
from bidi_responses.schema import JSONMapping, JSONObject, JSONValue
from bidi_responses.v1 import responses_pb2 as pb

from .depth import deep
from .structs import fill_struct, struct_to_dict
from .wire import exact

#: The optional fields of a function tool, null in the Response's echo when unset.
_FUNCTION_OPTIONAL = ("description", "parameters", "strict")


@runtime_checkable
class ProtoTools(Protocol):
    """A tool list that keeps its own protobuf form (the server's checked tool lists)."""

    def protobuf(self) -> Sequence[pb.Tool]:
        """The tools as ``Tool`` messages, built once."""
        ...


def tool_to_dict(tool: pb.Tool) -> JSONObject:
    """A Tool message as the JSON tool (unset optional fields left out)."""
    kind = tool.WhichOneof("tool")
    if kind == "function":
        f = tool.function
        result: JSONObject = {"type": "function", "name": f.name}
        if f.HasField("description"):
            result["description"] = f.description
        if f.parameters_json:  # the JSON form wins when both are set
            result["parameters"] = _json_value(f.parameters_json)
        elif f.HasField("parameters"):
            result["parameters"] = struct_to_dict(f.parameters)
        if f.HasField("strict"):
            result["strict"] = f.strict
        return result
    if kind == "other":
        return struct_to_dict(tool.other)
    return {}


class _BytesCache:
    """A small process-wide cache from bytes to bytes, oldest out first, bounded by count
    and by the bytes of its keys and values."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.entries: dict[bytes, bytes] = {}
        self.size = 0

    def get(self, key: bytes) -> bytes | None:
        return self.entries.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        cost = len(key) + len(value)
        entries = self.entries
        while entries and (len(entries) >= self.max_entries or self.size + cost > self.max_bytes):
            oldest = next(iter(entries))
            self.size -= len(oldest) + len(entries.pop(oldest))
        entries[key] = value
        self.size += cost


# Tools read back (the server's), by their serialized message: a stream sends the same tools
# every turn, and the streams of one agent fleet send the same ones. The values are the
# converted tools themselves, shared (see ``tools_to_dicts``).
_MAX_READ_TOOLS = 256
_MAX_READ_TOOL_BYTES = 4 << 20
_read_tools: dict[bytes, JSONObject] = {}
_read_tool_bytes = 0
# Tools as the client writes them (JSON -> serialized Tool) and reads them back from the
# Response echo (serialized Tool -> JSON, kept as JSON text: each read gets its own objects).
_written_tools = _BytesCache(256, 4 << 20)
_echoed_tools = _BytesCache(256, 4 << 20)


def forget_tools() -> None:
    """Empty the process-wide tool caches (for measurements of the first sight of a tool)."""
    global _read_tool_bytes
    _read_tools.clear()
    _read_tool_bytes = 0
    for cache in (_written_tools, _echoed_tools):
        cache.entries.clear()
        cache.size = 0


def tools_to_dicts(
    tools: Sequence[pb.Tool], keys: Sequence[bytes] | None = None
) -> list[JSONObject]:
    """Tool messages as JSON tools (``tool_to_dict``), each converted once while it stays
    in a small process-wide cache keyed by its serialized bytes: a create that repeats its
    tools costs their serialization (in C) instead of their conversion.

    ``keys``, when given, are the tools' serialized messages as they arrived (one per tool),
    which saves serializing them again. The returned tools are shared with later calls:
    callers must not modify them.
    """
    global _read_tool_bytes
    if keys is None or len(keys) != len(tools):
        keys = [tool.SerializeToString() for tool in tools]
    result: list[JSONObject] = []
    for index, key in enumerate(keys):
        cached = _read_tools.get(key)
        if cached is None:
            cached = tool_to_dict(tools[index])
            while _read_tools and (
                len(_read_tools) >= _MAX_READ_TOOLS
                or _read_tool_bytes + 2 * len(key) > _MAX_READ_TOOL_BYTES
            ):
                oldest = next(iter(_read_tools))
                del _read_tools[oldest]
                _read_tool_bytes -= 2 * len(oldest)
            _read_tools[key] = cached
            _read_tool_bytes += 2 * len(key)  # the key, and about as much for the dict
        result.append(cached)
    return result


def tool_echoes_to_dicts(tools: Sequence[pb.Tool]) -> list[JSONObject]:
    """Tool messages as a Response echoes them (``tool_echo_to_dict``), each converted once
    while cached by its bytes; every call returns new objects (the client's caller owns
    them), read from the cached JSON text."""
    result: list[JSONObject] = []
    for tool in tools:
        key = tool.SerializeToString()
        text = _echoed_tools.get(key)
        if text is None:
            converted = tool_echo_to_dict(tool)
            try:
                text = orjson.dumps(converted)
            except (TypeError, orjson.JSONEncodeError):  # NaN and the like: not cached
                result.append(converted)
                continue
            _echoed_tools.put(key, exact(text))
        result.append(orjson.loads(text))
    return result


def write_tools(
    params: pb.ResponseCreateParams,
    tools: Sequence[JSONMapping],
    *,
    json_parameters: bool = False,
) -> None:
    """Add JSON tools to ``params`` (``tool_to_pb``), each converted once while cached by its
    JSON text: a client sends the same tools every turn."""
    # (A class check: ``isinstance`` on a runtime Protocol costs microseconds.)
    if hasattr(type(tools), "protobuf") and not json_parameters:
        params.tools.extend(tools.protobuf())  # type: ignore[attr-defined]
        return
    form = b"j" if json_parameters else b"s"
    for tool in tools:
        try:
            key = form + orjson.dumps(tool)
        except (TypeError, orjson.JSONEncodeError):
            key = b"null"
        # JSON text names a tool exactly, except that NaN and infinities are written as null.
        if b"null" in key:
            params.tools.append(tool_to_pb(tool, json_parameters=json_parameters))
            continue
        data = _written_tools.get(key)
        if data is None:
            data = tool_to_pb(tool, json_parameters=json_parameters).SerializeToString()
            _written_tools.put(key, data)
        params.tools.add().MergeFromString(data)


def tool_echo_to_dict(tool: pb.Tool) -> JSONObject:
    """A Tool message as a Response echoes it: a function's optional fields null when unset."""
    result = tool_to_dict(tool)
    if result.get("type") == "function":
        for key in _FUNCTION_OPTIONAL:
            result.setdefault(key, None)
    return result


@deep
def tool_to_pb(tool: JSONMapping, *, json_parameters: bool = False) -> pb.Tool:
    """A JSON tool as a Tool (``json_parameters``: a function's schema as JSON text in
    ``parameters_json``, not as a Struct in ``parameters``)."""
    if tool.get("type") != "function":
        other = pb.Tool()
        fill_struct(other.other, tool)
        return other
    function = pb.FunctionTool(name=tool["name"])
    if tool.get("description") is not None:
        function.description = tool["description"]
    if tool.get("parameters") is not None:
        if json_parameters:
            function.parameters_json = orjson.dumps(tool["parameters"])
        else:
            fill_struct(function.parameters, tool["parameters"])
    if tool.get("strict") is not None:
        function.strict = tool["strict"]
    return pb.Tool(function=function)


def tools_to_pb(
    tools: Sequence[JSONMapping], *, json_parameters: bool = False
) -> Sequence[pb.Tool]:
    """A JSON tool list as Tool messages; a ``ProtoTools`` list gives its own (in the Struct
    form: the JSON form is built here, once per echo, see ``ProtoEncoder``)."""
    if hasattr(type(tools), "protobuf") and not json_parameters:
        return tools.protobuf()  # type: ignore[attr-defined, no-any-return]
    return [tool_to_pb(tool, json_parameters=json_parameters) for tool in tools]


def _json_value(text: bytes) -> JSONValue:
    """JSON text sent in a ``..._json`` field, parsed; text that is not JSON is passed on as
    it is, a string, which the core refuses where it expects an object, naming the field."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text.decode("utf-8", "replace")


def tool_choice_to_dict(choice: pb.ToolChoice) -> JSONValue:
    """A ToolChoice as JSON: the mode, or ``{"type": "function", "name"}``; None when unset."""
    which = choice.WhichOneof("choice")
    if which == "function":
        return {"type": "function", "name": choice.function.name}
    if which == "mode":
        return choice.mode
    return None


def tool_choice_to_pb(choice: JSONValue) -> pb.ToolChoice:
    """The JSON ``tool_choice`` (a mode or a forced function) as a ToolChoice."""
    if isinstance(choice, dict):
        return pb.ToolChoice(function=pb.FunctionToolChoice(name=choice.get("name", "")))
    return pb.ToolChoice(mode=str(choice))
