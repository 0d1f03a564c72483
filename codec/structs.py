"""Free-form JSON <-> ``google.protobuf.Struct``, both ways, for any nesting.

Both directions are written out rather than left to ``json_format``: it raises on NaN and
infinite numbers (those reach the core as floats, and the core refuses them with a 400 naming
the field, as it does for every transport), and ``Struct.update`` copies nested values through
a parse that stops at protobuf's default depth, which tool schemas exceed.
"""

from __future__ import annotations

from bidi_responses.schema import JSONMapping, JSONObject, JSONValue
from google.protobuf import struct_pb2

from .depth import deep


def struct_to_dict(struct: struct_pb2.Struct) -> JSONObject:
    """A Struct as a plain dict (integers that were sent as JSON numbers stay floats).

    A Struct is a map and keeps no key order (the sender's protobuf library already iterates
    it in its own hash order), so its keys come out sorted: the same schema gives the same
    prompt whatever the client's language. JSON transports keep the client's order."""
    fields = struct.fields
    return {key: value_to_py(fields[key]) for key in sorted(fields)}


def value_to_py(value: struct_pb2.Value) -> JSONValue:
    """A Struct ``Value`` as a plain JSON value."""
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
        return [value_to_py(v) for v in value.list_value.values]
    return None


@deep
def dict_to_struct(value: JSONMapping) -> struct_pb2.Struct:
    """A plain dict as a Struct, filled in place level by level."""
    struct = struct_pb2.Struct()
    fill_struct(struct, value)
    return struct


def fill_struct(struct: struct_pb2.Struct, value: JSONMapping) -> None:
    """Add ``value``'s keys to ``struct`` (a field of a message under construction)."""
    fields = struct.fields
    for key, item in value.items():
        _fill_value(fields[key], item)


def _fill_value(target: struct_pb2.Value, value: JSONValue) -> None:
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
        fill_struct(target.struct_value, value)
    elif isinstance(value, list | tuple):
        values = target.list_value
        values.SetInParent()
        for item in value:
            _fill_value(values.values.add(), item)
    else:
        raise TypeError(f"cannot put a {type(value).__name__} in a protobuf Struct")


def restore_integers(value: JSONValue) -> JSONValue:
    """JSON from a Struct with its integers back (Struct keeps every number as a double).

    Not a canonical form: object keys keep the client's order, as an echo must. The canonical
    form (sorted keys, for digests and rendering) is the core's ``jsonshape.canonical_json``.
    """
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {key: restore_integers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [restore_integers(item) for item in value]
    return value
