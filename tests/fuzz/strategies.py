"""Hypothesis strategies for hostile client input: JSON bodies, events and protobuf bytes.

Inputs mix well-formed requests, requests with one field replaced by something hostile (a
wrong type, deep nesting, NaN, control characters, huge numbers), and random bytes, so the
server sees both what real clients get wrong and what an attacker would send.
"""

from __future__ import annotations

from typing import Any

from bidi_responses.codec import deep_messages, params_to_pb
from bidi_responses.v1 import responses_pb2 as pb
from hypothesis import strategies as st

_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40
) | st.sampled_from(
    ["", "\n\r\x00", "sim-model", "user", "assistant", "message", "\u202e", "a" * 300]
)

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT
)

JSON = st.recursive(
    _SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_TEXT, children, max_size=4),
    max_leaves=12,
)


def _deep(depth: int, leaf: Any = "x") -> Any:
    value: Any = leaf
    for index in range(depth):
        value = {"type": value} if index % 2 else [value]
    return value


DEEP = st.integers(min_value=10, max_value=1500).map(_deep)
HOSTILE = JSON | DEEP

# Names and ids with what breaks headers, logs and terminals: control characters, a bidi
# override, and lengths far past any real id (echoed into statuses and error messages).
_CONTROL = st.sampled_from(["\n", "\r\n", "\x00", "\x7f", "\t", "\u202e", "\x1b[31m", "\ud7ff"])
NAMES = st.builds(lambda a, c, b: a + c + b, _TEXT, _CONTROL, _TEXT) | st.sampled_from(
    ["a\nb", "resp_\r\n", "x" * 5000, "resp_" + "9" * 10_000, "\u00e9" * 3000]
)
# What a closed-set field (an enum of strings) can be given instead: objects and arrays
# (unhashable: they once reached a set lookup), numbers, control characters.
NOT_ENUM = (
    st.dictionaries(_TEXT, JSON, min_size=0, max_size=2)
    | st.lists(JSON, max_size=3)
    | st.sampled_from([{"value": "high"}, ["auto"], [], {}, 1, 0.5, True, "HIGH", "auto\n"])
    | NAMES
)
# Arrays where content parts belong, holding scalars and odd shapes.
SCALAR_PARTS = st.lists(
    _SCALARS | st.lists(_SCALARS, max_size=2) | st.fixed_dictionaries({"type": JSON, "text": JSON}),
    min_size=1,
    max_size=4,
)


def nested_schema(levels: int) -> dict[str, Any]:
    """A JSON schema ``levels`` object/properties levels deep (real schemas nest like this)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


# Around the depth the server accepts (14 schema levels) and past it.
DEEP_SCHEMAS = st.integers(min_value=8, max_value=40).map(nested_schema)

ITEM_TYPES = [
    "message",
    "function_call",
    "function_call_output",
    "reasoning",
    "custom_tool_call",
    "custom_tool_call_output",
    "additional_tools",
    "bogus",
]


@st.composite
def items(draw: st.DrawFn) -> Any:
    """One input item: usually shaped like a real one, with fields that may be hostile."""
    if draw(st.integers(0, 9)) == 0:
        return draw(HOSTILE)
    kind = draw(st.sampled_from(ITEM_TYPES))
    item: dict[str, Any] = {"type": kind}
    fields = {
        "role": st.sampled_from(["user", "assistant", "developer", "system", "robot"]) | NOT_ENUM,
        "content": st.sampled_from(["hi", ""])
        | st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["input_text", "output_text", "input_image", "x"])},
                optional={"text": _TEXT, "image_url": _TEXT, "detail": _TEXT},
            ),
            max_size=3,
        ),
        "call_id": st.sampled_from(["call_1", ""]) | _TEXT | NAMES,
        "name": st.sampled_from(["exec_command", ""]) | _TEXT | NAMES,
        "arguments": st.sampled_from(["{}", '{"cmd":"ls"}', "{bad"]) | _TEXT,
        "output": _TEXT | SCALAR_PARTS,
        "status": st.sampled_from(["completed", "in_progress", "incomplete", "bogus"]) | NOT_ENUM,
        "input": _TEXT,
        "summary": st.lists(
            st.fixed_dictionaries({"type": st.just("summary_text"), "text": _TEXT})
        ),
        "tools": st.lists(JSON, max_size=2),
    }
    for name, strategy in fields.items():
        if draw(st.booleans()):
            item[name] = draw(strategy if draw(st.integers(0, 5)) else HOSTILE)
    return item


# A property name with control characters and a bad type: the field path once went raw into
# a gRPC trailer ("Invalid metadata").
_ODD_PROPERTY = st.builds(
    lambda name, kind: {"type": "object", "properties": {name: {"type": kind}}},
    NAMES,
    st.sampled_from(["string", "bogus"]) | NOT_ENUM,
)

TOOL = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "web_search", "custom"]), "name": _TEXT},
    optional={
        "parameters": st.sampled_from(
            [
                {"type": "object", "properties": {"x": {"type": "string"}}},
                {"type": "string"},
                {"type": ["object"], "required": ["y"]},
            ]
        )
        | HOSTILE
        | DEEP_SCHEMAS
        | _ODD_PROPERTY,
        "description": _TEXT,
        "strict": st.booleans(),
    },
)


# Strict output schemas whose keywords have the wrong shape (anyOf a number, $defs an array,
# required an object, ...): the strict checks once read them unchecked.
_STRICT_SCHEMAS = st.builds(
    lambda key, value: {
        "type": "object",
        "additionalProperties": False,
        "properties": {},
        "required": [],
        "$defs": {"d": {"type": "object", "additionalProperties": False, key: value}},
        key: value,
    },
    st.sampled_from(["anyOf", "allOf", "$defs", "definitions", "properties", "required", "items"]),
    _SCALARS | st.lists(_SCALARS, max_size=2) | NOT_ENUM,
)


@st.composite
def create_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A response.create body: a valid core with some fields hostile or missing."""
    body: dict[str, Any] = {"model": "sim-model", "input": "hi", "store": False}
    optional: dict[str, st.SearchStrategy[Any]] = {
        "input": _TEXT | st.lists(items(), max_size=4),
        "tools": st.lists(TOOL, max_size=3),
        "tool_choice": st.sampled_from(["auto", "none", "required", "sometimes"])
        | st.fixed_dictionaries({"type": st.just("function"), "name": _TEXT}),
        "instructions": _TEXT,
        "metadata": st.dictionaries(_TEXT, _TEXT | JSON, max_size=3),
        "previous_response_id": st.sampled_from(["resp_missing", ""]) | _TEXT | NAMES,
        "max_output_tokens": st.integers(-5, 100),
        "temperature": st.floats(allow_nan=False, allow_infinity=False),
        "top_p": st.floats(allow_nan=False, allow_infinity=False),
        "user": _TEXT,
        "stream_id": _TEXT,
        "generate": st.booleans(),
        "parallel_tool_calls": st.booleans(),
        "model": st.sampled_from(["sim-model", "", "gpt-nope"]) | NAMES,
        "truncation": st.sampled_from(["auto", "disabled"]) | NOT_ENUM,
        "text": st.fixed_dictionaries(
            {},
            optional={
                "verbosity": st.sampled_from(["low", "high"]) | NOT_ENUM,
                "format": st.fixed_dictionaries(
                    {"type": st.sampled_from(["text", "json_schema"]) | NOT_ENUM},
                    optional={
                        "name": st.just("out") | NAMES,
                        "strict": st.booleans(),
                        "schema": DEEP_SCHEMAS | _STRICT_SCHEMAS,
                    },
                ),
            },
        ),
        "reasoning": st.fixed_dictionaries(
            {},
            optional={
                "effort": st.sampled_from(["low", "high"]) | NOT_ENUM,
                "summary": st.sampled_from(["auto"]) | NOT_ENUM,
            },
        ),
        "include": st.lists(
            st.sampled_from(["reasoning.encrypted_content"]) | NOT_ENUM, max_size=2
        ),
    }
    for name, strategy in optional.items():
        if draw(st.integers(0, 3)) == 0:
            body[name] = draw(strategy if draw(st.integers(0, 4)) else HOSTILE)
    if draw(st.integers(0, 15)) == 0:
        del body["model"]
    return body


@st.composite
def client_events(draw: st.DrawFn) -> Any:
    """A WebSocket-mode client event (mostly response.create)."""
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return draw(HOSTILE)
    if choice == 1:
        return {
            "type": draw(st.sampled_from(["response.append", "response.cancel", "nope"]) | JSON)
        }
    return {"type": "response.create", **draw(create_bodies())}


def _connect(params: pb.ResponseCreateParams) -> bytes:
    return pb.ConnectRequest(response_create=params).SerializeToString()


def _stateless(params: pb.ResponseCreateParams) -> bytes:
    return pb.CreateResponseRequest(params=params).SerializeToString()


@st.composite
def connect_messages(draw: st.DrawFn, stateless: bool = False) -> bytes:
    """A serialized ConnectRequest (or CreateResponseRequest): typed from a fuzzed body, or
    raw bytes, or mutated."""
    wrap = _stateless if stateless else _connect
    body = draw(create_bodies())
    try:
        with deep_messages():
            message = wrap(params_to_pb(body))
    except Exception:  # a body protobuf cannot express: send a valid message instead
        message = wrap(params_to_pb({"model": "sim-model", "input": "hi"}))
    mode = draw(st.integers(0, 5))
    if mode == 0:
        return draw(st.binary(max_size=64))
    if mode == 1 and message:
        # Flip bytes: invalid UTF-8, bad tags, wrong lengths.
        data = bytearray(message)
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    if mode == 2 and message:
        return message[: draw(st.integers(0, len(message)))]
    return message


# The calls that name a stored object by id, with hostile ids (gRPC unary and HTTP routes).
BY_ID_CALLS = [
    "GetResponse",
    "DeleteResponse",
    "ListInputItems",
    "CancelResponse",
    "GetModel",
    "StreamResponse",
]


@st.composite
def by_id_requests(draw: st.DrawFn) -> tuple[str, str]:
    """One by-id call and a hostile id for it: control characters, very long, or ordinary."""
    call = draw(st.sampled_from(BY_ID_CALLS))
    ident = draw(NAMES | _TEXT | st.sampled_from(["resp_missing", "sim-model"]))
    return call, ident
