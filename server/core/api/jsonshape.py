"""Shape limits every client value passes before the core reads it: nesting and numbers.

One limit for every transport. JSON bodies, WebSocket frames and gRPC messages (whose free-form
parts arrive as protobuf ``Struct``) all become the same dict before the core sees them, and
this check runs on that dict, so a value nested too deep is refused with the same 400 naming
the same field whichever way it came.

The bound is what a stock gRPC client can read back. The Response echoes tools and the
output schema in every snapshot, as ``Struct``s, which spend three protobuf message levels per
JSON object; protobuf's parsers (Python, C++, Java) stop at 100 levels (grpc-js's protobufjs
counts map entries differently and reads 8 JSON levels more), and the deepest echo
(a batched event of ``CreateResponse``, whose hosted tools are Structs from ``tools[i]`` down)
leaves room for 31 JSON levels under ``tools[i]``. A schema deeper than that was accepted
once, and then every snapshot of its response failed to decode in a stock client ("Exception
deserializing response"); it is refused here instead, naming the field. That is 14 schema
levels (each a schema object plus its ``properties`` object) under ``tools[i].parameters`` or
``text.format.schema``; the hosted API's structured outputs allow 10.

NaN and the infinities are not JSON (the hosted API rejects them, and a ``Struct`` holding one
cannot be serialized back to JSON), so a non-finite number is refused here too.
"""

from __future__ import annotations

import math

from bidi_responses.schema import JSONValue

from .errors import ApiError, shown_path

#: Objects and arrays nested deeper than this, counted from the request body (or client event)
#: itself as level 0, are refused: ``tools[0]`` is level 2, so its deepest object is level 32,
#: 31 levels down, the most a stock gRPC client decodes in every echo
#: (``tests/hostile/test_deep_echo.py`` checks each echo with stock stubs).
MAX_JSON_DEPTH = 33


def check_json_shape(value: JSONValue, *, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise ApiError (400) naming the field if ``value`` nests too deep or holds a non-finite
    number. Iterative, so a hostile value cannot exhaust the stack while it is checked."""
    # The fast pass goes level by level and keeps no paths (it runs on every request, ~1 µs
    # per object or array); only a value that fails is walked again to name the field.
    level = [value] if type(value) in (dict, list) else []
    depth = 0
    while level:
        if depth >= max_depth:
            raise _locate(value, max_depth)
        deeper = []
        for node in level:
            for child in node.values() if type(node) is dict else node:
                kind = type(child)
                if kind is dict or kind is list:
                    deeper.append(child)
                elif kind is float and child - child != 0.0:  # NaN or an infinity
                    raise _locate(value, max_depth)
        level = deeper
        depth += 1
    if type(value) is float and value - value != 0.0:
        raise _locate(value, max_depth)


def _locate(value: JSONValue, max_depth: int) -> ApiError:
    """The error for the first offending field of ``value`` (depth first, in order)."""
    stack: list[tuple[JSONValue, int, str]] = [(value, 0, "")]
    while stack:
        current, depth, path = stack.pop()
        if isinstance(current, float) and not math.isfinite(current):
            return _error(path, f"{current!r} is not a valid JSON number.", "invalid_value")
        if not isinstance(current, dict | list):
            continue
        if depth >= max_depth:
            return _error(
                path,
                f"objects and arrays may nest at most {max_depth} levels deep, counted from "
                "the request (14 schema levels under a tool's 'parameters'): the response "
                "echoes them, and a deeper echo cannot be decoded by gRPC clients.",
                "nesting_too_deep",
            )
        pairs = (
            [(f"{path}.{k}" if path else str(k), v) for k, v in current.items()]
            if isinstance(current, dict)
            else [(f"{path}[{i}]", v) for i, v in enumerate(current)]
        )
        for child_path, child in reversed(pairs):
            stack.append((child, depth + 1, child_path))
    return _error("", "the value is not valid JSON.", "invalid_value")  # not reached


def _error(path: str, reason: str, code: str) -> ApiError:
    if not path:
        return ApiError("Invalid request: " + reason, code=code)
    return ApiError(f"Invalid '{shown_path(path)}': {reason}", code=code, param=path)


def plain_numbers(value: JSONValue) -> JSONValue:
    """``value`` with each integral float as the integer, object keys in the client's order.

    What a model sees of a client's JSON (tool parameters, output schemas): the order the
    client wrote is part of the prompt, as the model's own renderers keep it; only the number
    type a ``Struct`` loses is restored.
    """
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {key: plain_numbers(inner) for key, inner in value.items()}
    if isinstance(value, list):
        return [plain_numbers(item) for item in value]
    return value


def canonical_json(value: JSONValue) -> JSONValue:
    """A JSON value in canonical form: object keys sorted, an integral float as the integer.

    For fingerprints and comparisons only: a prompt keeps the client's order (``plain_numbers``).

    JSON objects are unordered and JSON has one number type, but gRPC carries free-form JSON
    (tool schemas, pass-through items) in protobuf ``Struct``, which keeps neither the key
    order nor integers (every number is a double). Rendering and sampling from the canonical
    form make the same tools give the same tokens and the same output on every transport.
    """
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {key: canonical_json(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [canonical_json(item) for item in value]
    return value
