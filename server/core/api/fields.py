"""Checked readers of single JSON fields, shared by the request and item parsers.

Each returns the value in the type the core uses, or raises an ``ApiError`` that names the
field (its path in the request, such as ``input[2].call_id``) and says what was expected.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Literal, TypeVar, overload

from bidi_responses.schema import JSONObject, JSONValue

from .errors import ApiError, invalid, missing, shown

_Name = TypeVar("_Name", bound=str)


def field_path(where: str, key: str) -> str:
    """The path of ``key`` inside ``where`` (``where`` empty: the body's own field)."""
    return f"{where}.{key}" if where else key


def opt_str(obj: JSONObject, key: str, where: str = "") -> str | None:
    """An optional string field."""
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(
            field_path(where, key),
            f"expected a string, got {type(value).__name__}.",
            code="invalid_type",
        )
    return value


def optional_model(obj: JSONObject) -> str | None:
    """The ``model`` field; ``None`` when absent or empty."""
    value = obj.get("model")
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise invalid("model", "expected a string.", code="invalid_type")
    return value


def required_model(obj: JSONObject) -> str:
    """The ``model`` field, which must be a non-empty string."""
    model = optional_model(obj)
    if model is None:
        raise missing("model")
    return model


def opt_bool(obj: JSONObject, key: str, default: bool) -> bool:
    """An optional boolean field; ``default`` when absent."""
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(key, f"expected a boolean, got {type(value).__name__}.", code="invalid_type")
    return value


def opt_number(obj: JSONObject, key: str, default: float, lo: float, hi: float) -> float:
    """An optional number in ``[lo, hi]``; ``default`` when absent."""
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(key, f"expected a number, got {type(value).__name__}.", code="invalid_type")
    if not lo <= value <= hi:
        raise invalid(key, f"must be between {lo} and {hi}, got {value}.")
    return float(value)


def too_long(where: str, limit: int, got: int) -> ApiError:
    """The error for a string (or an item's text) over ``limit`` characters."""
    return invalid(
        where,
        f"string too long: at most {limit} characters, got {got}.",
        code="string_above_max_length",
    )


def text(value: JSONValue, where: str, max_chars: int, *, required: bool = True) -> str:
    """A string of at most ``max_chars``; required unless ``required`` is False (then None
    reads as "")."""
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        if value is None:
            raise missing(where)
        raise invalid(where, f"expected a string, got {type(value).__name__}.", code="invalid_type")
    if len(value) > max_chars:
        raise too_long(where, max_chars, len(value))
    return value


def json_type(value: JSONValue) -> str:
    """The JSON name of a value's type, as error messages say it ("an object", "a string")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def one_of(allowed: Iterable[str]) -> str:
    """``'a', 'b' or 'c'``: the values of a closed set, as a message lists them."""
    names = [f"'{name}'" for name in allowed]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


@overload
def closed(
    value: JSONValue, where: str, allowed: Collection[_Name], *, required: Literal[True]
) -> _Name: ...
@overload
def closed(
    value: JSONValue, where: str, allowed: Collection[_Name], *, required: bool = False
) -> _Name | None: ...
def closed(
    value: JSONValue, where: str, allowed: Collection[_Name], *, required: bool = False
) -> _Name | None:
    """A string field that must be one of ``allowed`` (None when absent, unless ``required``).

    Every closed-set field of a request is read here: any JSON value, an object or an array
    included, gets a 400 naming the field, never a lookup of an unhashable value.
    """
    if value is None:
        if required:
            raise missing(where)
        return None
    if isinstance(value, str):
        for name in allowed:
            if value == name:
                return name
    got = f"'{shown(value)}'" if isinstance(value, str) else json_type(value)
    listed = allowed if isinstance(allowed, tuple) else sorted(allowed)
    raise invalid(where, f"expected {one_of(listed)}; got {got}.")
