"""The input items of a request: each checked and normalized to the one form the core keeps.

``parse_input`` takes the ``input`` of a create (or an append): a string, or an array of
items, each of which ``normalize_item`` checks by its kind and returns in canonical form
(messages with content parts, function calls with their JSON arguments, ...), with its text
size for the request's limits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from bidi_responses.schema import (
    CompactionItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    Item,
    JSONObject,
    JSONValue,
    MessageItem,
    PassthroughItem,
    ReasoningItem,
)

from ...config import Limits
from .errors import ApiError, invalid, missing, shown
from .fields import closed, json_type, opt_str, text, too_long

# Each normalizer builds the item as plain JSON while it checks it, and returns it as its kind
# (a ``cast``: this module is where raw JSON becomes a checked item).

_ROLES = ("user", "assistant", "system", "developer")
_PART_TYPES = ("input_text", "output_text", "refusal", "input_image")
# Item kinds that real clients send and the server carries along without a typed case.
_PASSTHROUGH_ITEMS = frozenset({"custom_tool_call", "custom_tool_call_output", "additional_tools"})
# Opaque items: their only content is a server-sealed token, which the core checks against the
# server key before the item is rendered (``core.runs.compaction``).
_OPAQUE_ITEMS = frozenset({"compaction"})
# Closed sets of the hosted API: anything else is refused, never carried along silently.
_ITEM_STATUSES = frozenset({"in_progress", "completed", "incomplete"})
_IMAGE_DETAILS = frozenset({"auto", "low", "high"})


def parse_input(raw: JSONValue, limits: Limits, *, where: str = "input") -> tuple[list[Item], int]:
    """Normalize the input (a string or a list of items); return the items and their size."""
    if raw is None:
        return [], 0
    if isinstance(raw, str):
        if len(raw) > limits.max_item_chars:
            raise too_long(where, limits.max_item_chars, len(raw))
        return [cast(MessageItem, _message("user", [{"type": "input_text", "text": raw}]))], len(
            raw
        )
    if not isinstance(raw, list):
        raise invalid(where, "expected a string or an array of items.", code="invalid_type")
    if len(raw) > limits.max_input_items:
        raise invalid(where, f"at most {limits.max_input_items} items are allowed, got {len(raw)}.")
    items: list[Item] = []
    total = 0
    for index, entry in enumerate(raw):
        item, size = normalize_item(entry, f"{where}[{index}]", limits)
        total += size
        if total > limits.max_request_chars:
            raise ApiError(
                f"Invalid '{where}': the input is larger than {limits.max_request_chars} "
                "characters.",
                code="input_too_large",
                param=where,
                status=400,
            )
        items.append(item)
    return items, total


def normalize_item(entry: JSONValue, where: str, limits: Limits) -> tuple[Item, int]:
    """Check one input item and return its canonical form and its text size."""
    if not isinstance(entry, dict):
        raise invalid(where, "expected an object.", code="invalid_type")
    kind = entry.get("type")
    if kind is None and "role" in entry:
        kind = "message"
    if kind is not None and not isinstance(kind, str):
        raise invalid(
            f"{where}.type", f"expected a string, got {type(kind).__name__}.", code="invalid_type"
        )
    normalize = _BY_KIND.get(kind) if kind is not None else None
    if normalize is not None:
        return normalize(entry, where, limits.max_item_chars)
    if kind in _OPAQUE_ITEMS:
        return normalize_opaque_item(entry, kind, where, limits)
    if kind in _PASSTHROUGH_ITEMS:
        _check_passthrough(kind, entry, where, limits.max_item_chars)
        item = dict(entry)
        size = sum(len(v) for v in item.values() if isinstance(v, str))
        if size > limits.max_item_chars:
            raise too_long(where, limits.max_item_chars, size)
        return cast(PassthroughItem, item), size
    if kind is None:
        raise missing(f"{where}.type")
    raise invalid(f"{where}.type", f"unknown item type '{shown(kind)}'.")


def normalize_opaque_item(
    entry: JSONObject, kind: str, where: str, limits: Limits
) -> tuple[Item, int]:
    """A ``compaction`` item: ``encrypted_content`` (required) and an optional ``id``.

    The token's integrity is checked against the server key before the item is rendered
    (``core.runs.compaction``); here only its shape.
    """
    max_chars = limits.max_item_chars
    content = text(entry.get("encrypted_content"), f"{where}.encrypted_content", max_chars)
    if not content:
        raise missing(f"{where}.encrypted_content")
    item: JSONObject = {"type": kind, "encrypted_content": content}
    for key in ("id", "created_by"):
        value = entry.get(key)
        if value is not None:
            item[key] = text(value, f"{where}.{key}", max_chars)
    return cast(CompactionItem, item), len(content)


# -- one normalizer per item kind ------------------------------------------------------------


def _message(role: str, content: list[JSONObject]) -> JSONObject:
    return {"type": "message", "role": role, "content": content}


def _normalize_message(entry: JSONObject, where: str, max_chars: int) -> tuple[Item, int]:
    role = closed(entry.get("role"), f"{where}.role", _ROLES, required=True)
    content = entry.get("content")
    size = 0
    parts: list[JSONObject] = []
    if isinstance(content, str):
        size = len(text(content, f"{where}.content", max_chars))
        parts = [{"type": "output_text" if role == "assistant" else "input_text", "text": content}]
        if role == "assistant":
            parts[0]["annotations"] = []
    elif isinstance(content, list):
        for p_index, part in enumerate(content):
            new_part, part_size = _content_part(part, f"{where}.content[{p_index}]", max_chars)
            parts.append(new_part)
            size += part_size
    else:
        raise invalid(
            f"{where}.content",
            "expected a string or an array of content parts.",
            code="invalid_type",
        )
    item = _message(role, parts)
    _copy_keys(entry, item, where, ("id", "status", "phase"))
    return cast(MessageItem, item), size


def _content_part(part: JSONValue, where: str, max_chars: int) -> tuple[JSONObject, int]:
    """One content part of a message, and its text size."""
    if not isinstance(part, dict):
        raise invalid(
            where,
            f"expected a content part (an object), got {json_type(part)}.",
            code="invalid_type",
        )
    p_type = closed(part.get("type"), f"{where}.type", _PART_TYPES, required=True)
    if p_type == "refusal":
        refusal = text(part.get("refusal"), f"{where}.refusal", max_chars)
        return {"type": "refusal", "refusal": refusal}, len(refusal)
    if p_type == "input_image":
        url = text(part.get("image_url"), f"{where}.image_url", max_chars)
        detail = closed(part.get("detail") or None, f"{where}.detail", _IMAGE_DETAILS)
        return {"type": "input_image", "image_url": url, "detail": detail or "auto"}, 0
    value = text(part.get("text"), f"{where}.text", max_chars)
    new_part: JSONObject = {"type": p_type, "text": value}
    if p_type == "output_text":
        annotations = part.get("annotations") or []
        if not isinstance(annotations, list):
            raise invalid(f"{where}.annotations", "expected an array.", code="invalid_type")
        new_part["annotations"] = annotations
    return new_part, len(value)


def _normalize_function_call(entry: JSONObject, where: str, max_chars: int) -> tuple[Item, int]:
    call_id = text(entry.get("call_id"), f"{where}.call_id", max_chars)
    name = text(entry.get("name"), f"{where}.name", max_chars)
    if entry.get("status") == "incomplete":  # cut short by max_output_tokens
        arguments = text(entry.get("arguments"), f"{where}.arguments", max_chars)
    else:
        arguments = _arguments(entry.get("arguments"), f"{where}.arguments", max_chars)
    if not call_id:
        raise missing(f"{where}.call_id")
    if not name:
        raise missing(f"{where}.name")
    item: JSONObject = {
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
    _copy_keys(entry, item, where, ("id", "status"))
    return cast(FunctionCallItem, item), len(arguments) + len(name)


def _normalize_function_call_output(
    entry: JSONObject, where: str, max_chars: int
) -> tuple[Item, int]:
    call_id = text(entry.get("call_id"), f"{where}.call_id", max_chars)
    if not call_id:
        raise missing(f"{where}.call_id")
    output = entry.get("output")
    if isinstance(output, list):
        texts = []
        for o_index, part in enumerate(output):
            if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text"):
                raise invalid(f"{where}.output[{o_index}]", "expected a text content part.")
            texts.append(text(part.get("text"), f"{where}.output[{o_index}].text", max_chars))
        output = "".join(texts)
    output = text(output, f"{where}.output", max_chars)
    item: JSONObject = {"type": "function_call_output", "call_id": call_id, "output": output}
    _copy_keys(entry, item, where, ("id", "status"))
    return cast(FunctionCallOutputItem, item), len(output)


def _normalize_reasoning(entry: JSONObject, where: str, max_chars: int) -> tuple[Item, int]:
    summary = entry.get("summary") or []
    if not isinstance(summary, list):
        raise invalid(f"{where}.summary", "expected an array.", code="invalid_type")
    parts: list[JSONObject] = []
    size = 0
    for s_index, part in enumerate(summary):
        value = text(
            part.get("text") if isinstance(part, dict) else None,
            f"{where}.summary[{s_index}].text",
            max_chars,
        )
        parts.append({"type": "summary_text", "text": value})
        size += len(value)
    item: JSONObject = {"type": "reasoning", "summary": parts}
    _copy_keys(entry, item, where, ("id", "encrypted_content", "status"))
    return cast(ReasoningItem, item), size


_BY_KIND: dict[str, Callable[[JSONObject, str, int], tuple[Item, int]]] = {
    "message": _normalize_message,
    "function_call": _normalize_function_call,
    "function_call_output": _normalize_function_call_output,
    "reasoning": _normalize_reasoning,
}


# -- fields shared by several kinds ----------------------------------------------------------


def _item_key(entry: JSONObject, key: str, where: str) -> str | None:
    """An optional ``id``/``status``/... field of an item, checked (``status`` is a closed
    set, the others strings)."""
    if key == "status":
        return closed(entry.get(key), f"{where}.status", _ITEM_STATUSES)
    return opt_str(entry, key, where)


def _copy_keys(entry: JSONObject, item: JSONObject, where: str, keys: tuple[str, ...]) -> None:
    """Carry the optional ``id``/``status``/... fields over, checked."""
    for key in keys:
        value = _item_key(entry, key, where)
        if value:
            item[key] = value


def _arguments(value: JSONValue, where: str, max_chars: int) -> str:
    """Function-call arguments: a string, taken as it is. A model's arguments are usually
    JSON, but a real model can write anything in a call (a small or constrained one writes
    text); a client sends its history back as it received it, so the server must take back
    whatever it returned, or the conversation can never continue."""
    return text(value, where, max_chars)


def _check_output_parts(output: JSONValue, where: str, max_chars: int) -> None:
    """A tool output carried along: a string, or an array of content parts (objects with a
    string ``type``; a ``text``, when present, a string)."""
    if isinstance(output, str):
        return
    if not isinstance(output, list):
        raise invalid(where, "expected a string or an array of content parts.", code="invalid_type")
    for index, part in enumerate(output):
        if not isinstance(part, dict):
            raise invalid(
                f"{where}[{index}]",
                f"expected a content part (an object), got {json_type(part)}.",
                code="invalid_type",
            )
        if not isinstance(part.get("type"), str):
            raise invalid(
                f"{where}[{index}].type",
                f"expected a string, got {json_type(part.get('type'))}.",
                code="invalid_type",
            )
        if "text" in part:
            text(part["text"], f"{where}[{index}].text", max_chars)


def _check_passthrough(kind: str, entry: JSONObject, where: str, max_chars: int) -> None:
    """The fields the core itself reads from items it otherwise carries along unchanged."""
    if kind in ("custom_tool_call", "custom_tool_call_output"):
        call_id = text(entry.get("call_id"), f"{where}.call_id", max_chars)
        if not call_id:
            raise missing(f"{where}.call_id")
    if kind == "custom_tool_call":
        if not text(entry.get("name"), f"{where}.name", max_chars):
            raise missing(f"{where}.name")
        text(entry.get("input"), f"{where}.input", max_chars, required=False)
    elif kind == "custom_tool_call_output":
        _check_output_parts(entry.get("output"), f"{where}.output", max_chars)
    elif kind == "additional_tools":
        tools = entry.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise invalid(f"{where}.tools", "expected an array of tools.", code="invalid_type")
    for key in ("id", "status"):
        _item_key(entry, key, where)
