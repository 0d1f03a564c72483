"""The tools of a request, checked once per distinct tool list.

Clients send the same tool definitions with every turn of a conversation. A ``ToolSet`` holds
everything the core derives from one list: the checked tools as the Response echoes them, the
function names, the engine's function specs, and, built on first use, their protobuf form (the
gRPC echo) and their rendered tokens. It is immutable, so a lane keeps the last one and hands it
to the next request whose tools have the same fingerprint, skipping the checks and conversions;
nothing else keeps tools between turns.
"""

from __future__ import annotations

import hashlib
import re
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson
from bidi_responses.schema import JSONObject, JSONValue, ToolChoice, ToolChoiceMode

from ...config import Limits
from .errors import invalid, missing, shown
from .jsonshape import canonical_json

if TYPE_CHECKING:
    from array import array

    from bidi_responses.v1.responses_pb2 import Tool

    from ..conversation.state import PrefixRenderer


_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SCHEMA_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_TOOL_CHOICE_MODES: dict[str, ToolChoiceMode] = {
    "none": "none",
    "auto": "auto",
    "required": "required",
}


@dataclass(frozen=True, slots=True)
class FunctionSpec:
    """A callable function tool as the engine sees it (name and JSON-schema parameters)."""

    name: str
    parameters: JSONObject


class ToolList(list[JSONObject]):
    """Checked tools as the Response echoes them (JSON transports write it as a list), keeping
    the protobuf form that the gRPC encoder asks for (``codec.tools.ProtoTools``)."""

    __slots__ = ("_protobuf",)

    def __init__(self, tools: Iterable[JSONObject] = ()) -> None:
        super().__init__(tools)
        self._protobuf: tuple[Tool, ...] | None = None

    def protobuf(self) -> Sequence[Tool]:
        """The tools as ``Tool`` messages, converted on the first call."""
        if self._protobuf is None:
            # Imported here: the core runs without protobuf on its import path.
            from bidi_responses.codec.tools import tool_to_pb

            self._protobuf = tuple(tool_to_pb(tool) for tool in self)
        return self._protobuf


@dataclass(frozen=True, slots=True)
class ToolSet:
    """One checked tool list and what the core derives from it; never mutated once built
    (the derived forms are filled in on first use)."""

    #: Digest of the list's canonical JSON (sorted keys), as the client sent it.
    fingerprint: bytes | None
    #: The checked tools, normalized as the Response echoes them.
    tools: ToolList
    #: Names of the function tools, which ``tool_choice`` and function calls must name.
    function_names: frozenset[str]
    #: The function tools as the engine sees them, with canonical key order and numbers so
    #: that gRPC (Struct) and JSON clients sample alike.
    functions: tuple[FunctionSpec, ...]
    #: Rendered tools per live renderer (one per chat format), see ``prefix_tokens``.
    _prefix_tokens: weakref.WeakKeyDictionary[PrefixRenderer, array[int]] = field(
        default_factory=weakref.WeakKeyDictionary, compare=False, repr=False
    )

    @classmethod
    def of(cls, raw: JSONValue, limits: Limits, last: ToolSet | None = None) -> ToolSet:
        """The tool set of ``raw``: ``last`` again when the list is the same, else a new one."""
        key = fingerprint(raw)
        if last is not None and key is not None and last.fingerprint == key:
            return last
        tools = parse_tools(raw, limits)
        functions = tuple(
            FunctionSpec(
                t["name"],
                canonical_json(t.get("parameters")) or {"type": "object", "properties": {}},
            )
            for t in tools
            if t["type"] == "function"
        )
        return cls(key, ToolList(tools), frozenset(f.name for f in functions), functions)

    def protobuf(self) -> Sequence[Tool]:
        """The tools as ``Tool`` messages (the gRPC echo), converted once."""
        return self.tools.protobuf()

    def prefix_tokens(self, renderer: PrefixRenderer) -> array[int]:
        """The tokens ``renderer`` writes for these tools at the start of a prompt, rendered
        once per renderer: the tools section of the generic format, the developer message of
        harmony (which renders instructions and tools as one unit, here without instructions).
        Callers must not modify the array."""
        tokens = self._prefix_tokens.get(renderer)
        if tokens is None:
            tokens = self._prefix_tokens[renderer] = renderer.render_prefix(None, self.tools)
        return tokens


#: The tool set of a request without tools.
NO_TOOLS = ToolSet(None, ToolList(), frozenset(), ())


def fingerprint(raw: JSONValue) -> bytes | None:
    """A digest of a tool list's canonical JSON; None when it cannot be serialized (the checks
    then run and name the bad field)."""
    if raw is None:
        return None
    try:
        data = orjson.dumps(raw, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        return None
    return hashlib.blake2b(data, digest_size=16).digest()


def parse_tool_choice(value: JSONValue) -> ToolChoice:
    """``tool_choice`` as a mode, or ``{"type": "function", "name": ...}`` for a forced one."""
    if value is None:
        return "auto"
    if isinstance(value, str):
        mode = _TOOL_CHOICE_MODES.get(value)
        if mode is None:
            raise invalid("tool_choice", "expected 'none', 'auto', 'required' or a function.")
        return mode
    if isinstance(value, dict) and value.get("type") == "function":
        name = value.get("name")
        if not isinstance(name, str) or not name:
            raise missing("tool_choice.name")
        return {"type": "function", "name": name}
    raise invalid("tool_choice", "expected 'none', 'auto', 'required' or a function.")


def parse_tools(raw: JSONValue, limits: Limits) -> list[JSONObject]:
    """Check tool definitions and return them normalized as the Response echoes them."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise invalid("tools", "expected an array of tools.", code="invalid_type")
    if len(raw) > limits.max_tools:
        raise invalid("tools", f"at most {limits.max_tools} tools are allowed.")
    tools: list[JSONObject] = []
    names: set[str] = set()
    for index, tool in enumerate(raw):
        where = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise invalid(where, "expected an object.", code="invalid_type")
        kind = tool.get("type")
        if not isinstance(kind, str) or not kind:
            raise missing(f"{where}.type")
        if kind != "function":
            tools.append(dict(tool))
            continue
        name = tool.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise invalid(f"{where}.name", "expected 1-64 characters of [A-Za-z0-9_-].")
        if name in names:
            raise invalid(f"{where}.name", f"duplicate function name '{name}'.")
        names.add(name)
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise invalid(f"{where}.description", "expected a string.", code="invalid_type")
        parameters = tool.get("parameters")
        if parameters is not None:
            check_schema(parameters, f"{where}.parameters", top=True)
        strict = tool.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise invalid(f"{where}.strict", "expected a boolean.", code="invalid_type")
        tools.append(
            {
                "type": "function",
                "name": name,
                "description": description,
                "parameters": parameters,
                "strict": strict,
            }
        )
    return tools


def check_schema(schema: JSONValue, where: str, *, top: bool = False, depth: int = 0) -> None:
    """Reject JSON schemas the model could not produce arguments for."""
    if depth > 32:
        raise invalid(where, "schema nesting is deeper than 32 levels.")
    if not isinstance(schema, dict):
        raise invalid(where, "a JSON schema must be an object.", code="invalid_function_parameters")
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for k in kinds:
        if not isinstance(k, str):
            raise invalid(
                f"{where}.type",
                "expected a JSON schema type name or an array of them.",
                code="invalid_function_parameters",
            )
        if k not in _SCHEMA_TYPES:
            raise invalid(
                f"{where}.type",
                f"'{shown(k)}' is not a JSON schema type.",
                code="invalid_function_parameters",
            )
    if top and kinds != ["object"]:
        raise invalid(
            f"{where}.type",
            "function parameters must be a schema of type 'object'.",
            code="invalid_function_parameters",
        )
    properties = schema.get("properties")
    if properties is not None:
        if not isinstance(properties, dict):
            raise invalid(
                f"{where}.properties", "expected an object.", code="invalid_function_parameters"
            )
        for name, sub in properties.items():
            check_schema(sub, f"{where}.properties.{name}", depth=depth + 1)
    required = schema.get("required")
    if required is not None:
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise invalid(
                f"{where}.required",
                "expected an array of property names.",
                code="invalid_function_parameters",
            )
        unknown = [r for r in required if r not in (properties or {})]
        if unknown:
            raise invalid(
                f"{where}.required",
                f"names undefined properties: {', '.join(unknown)}.",
                code="invalid_function_parameters",
            )
    items = schema.get("items")
    if items is not None:
        check_schema(items, f"{where}.items", depth=depth + 1)
    enum = schema.get("enum")
    if enum is not None and (not isinstance(enum, list) or not enum):
        raise invalid(
            f"{where}.enum", "expected a non-empty array.", code="invalid_function_parameters"
        )
