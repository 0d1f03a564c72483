"""Checked readers of single JSON fields, shared by the request and item parsers.

Each returns the value in the type the core uses, or raises an ``ApiError`` that names the
field (its path in the request, such as ``input[2].call_id``) and says what was expected.
"""

from __future__ import annotations

from bidi_responses.server.core.api.errors import ApiError, invalid, missing
from bidi_responses.server.core.api.items import JSONObject, JSONValue


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


def closed(value: JSONValue, where: str, allowed: frozenset[str]) -> str | None:
    """An optional string that must be one of ``allowed``."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in allowed:
        shown = f"'{value}'" if isinstance(value, str) else f"a {type(value).__name__}"
        raise invalid(where, f"expected one of {', '.join(sorted(allowed))}; got {shown}.")
    return value
