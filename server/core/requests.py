"""The create request: parsed from a JSON-shaped body and checked field by field.

Every transport hands the core the same JSON-shaped dict (the body of POST /v1/responses, the
WebSocket ``response.create`` frame, or the gRPC message mapped by name). Parsing checks only
what the request carries: the new input, never the cached history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from bidi_responses.server.config import Limits
from bidi_responses.server.core import params
from bidi_responses.server.core.errors import ApiError, invalid, missing
from bidi_responses.server.core.event_types import ReasoningConfig, TextConfig, ToolChoice
from bidi_responses.server.core.items import (
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
from bidi_responses.server.core.jsonshape import canonical_json
from bidi_responses.server.core.tools import NO_TOOLS, ToolSet, check_schema, parse_tool_choice

_ROLES = frozenset({"user", "assistant", "system", "developer"})
_PART_TYPES = frozenset({"input_text", "output_text", "refusal", "input_image"})
# Item kinds that real clients send and the server carries along without a typed case.
_PASSTHROUGH_ITEMS = frozenset({"custom_tool_call", "custom_tool_call_output", "additional_tools"})
# Opaque items: their only content is a server-sealed token, which the core checks against the
# server key before the item is rendered (``core.compaction``).
_OPAQUE_ITEMS = frozenset({"compaction"})
# Closed sets of the hosted API: anything else is refused, never carried along silently.
_ITEM_STATUSES = frozenset({"in_progress", "completed", "incomplete"})
_IMAGE_DETAILS = frozenset({"auto", "low", "high"})


@dataclass(slots=True)
class CreateRequest:
    """A checked create request. ``input`` holds normalized items (see ``normalize_item``)."""

    model: str
    input: list[Item]
    instructions: str | None = None
    toolset: ToolSet = NO_TOOLS
    tool_choice: ToolChoice = "auto"
    previous_response_id: str | None = None
    store: bool = True
    max_output_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    parallel_tool_calls: bool = True
    metadata: dict[str, str] = field(default_factory=dict)
    generate: bool = True
    append_mode: bool = False
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    user: str | None = None
    stream: bool = False
    background: bool = False
    # Output settings (see ``core.params``), normalized as the Response echoes them.
    text: TextConfig = field(default_factory=lambda: params.TEXT_DEFAULT.copy())
    reasoning: ReasoningConfig | None = None
    truncation: str = "disabled"
    include: list[str] = field(default_factory=list)
    max_tool_calls: int | None = None
    # Names the response this turn creates, so a retried turn is not run twice (idempotency.py).
    idempotency_key: str | None = None

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The checked tools, as the Response echoes them."""
        return self.toolset.tools

    def output_format(self) -> dict[str, Any] | None:
        """The structured-output format in canonical form, so that gRPC (Struct) and JSON
        clients render and sample alike."""
        fmt = params.response_format(self.text)
        return canonical_json(fmt) if fmt is not None else None


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(key, f"expected a string, got {type(value).__name__}.", code="invalid_type")
    return value


def _opt_bool(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(key, f"expected a boolean, got {type(value).__name__}.", code="invalid_type")
    return value


def _opt_number(body: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(key, f"expected a number, got {type(value).__name__}.", code="invalid_type")
    if not lo <= value <= hi:
        raise invalid(key, f"must be between {lo} and {hi}, got {value}.")
    return float(value)


def parse_create(body: Any, limits: Limits, last_tools: ToolSet | None = None) -> CreateRequest:
    """Check a create body and return a CreateRequest; raise ApiError naming the bad field."""
    if not isinstance(body, dict):
        raise ApiError("The request body must be a JSON object.", code="invalid_type")
    model = body.get("model")
    if model is None or model == "":
        raise missing("model")
    if not isinstance(model, str):
        raise invalid("model", "expected a string.", code="invalid_type")

    max_output = body.get("max_output_tokens")
    if max_output is not None and (
        isinstance(max_output, bool) or not isinstance(max_output, int) or max_output < 16
    ):
        raise invalid("max_output_tokens", "expected an integer >= 16.")

    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise invalid("metadata", "expected an object of string values.", code="invalid_type")
    if len(metadata) > limits.max_metadata_pairs:
        raise invalid("metadata", f"at most {limits.max_metadata_pairs} pairs are allowed.")
    for key, value in metadata.items():
        if len(key) > 64:
            raise invalid(
                "metadata", f"keys may have at most 64 characters; got one of {len(key)}."
            )
        if not isinstance(value, str):
            raise invalid(
                f"metadata.{key}",
                f"values must be strings, got {type(value).__name__}.",
                code="invalid_type",
            )
        if len(value) > 512:
            raise invalid(
                f"metadata.{key}",
                f"values may have at most 512 characters, got {len(value)}.",
                code="string_above_max_length",
            )

    request = CreateRequest(
        model=model,
        input=[],
        instructions=_opt_str(body, "instructions"),
        previous_response_id=_opt_str(body, "previous_response_id") or None,
        store=_opt_bool(body, "store", True),
        max_output_tokens=max_output,
        temperature=_opt_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_opt_number(body, "top_p", 1.0, 0.0, 1.0),
        parallel_tool_calls=_opt_bool(body, "parallel_tool_calls", True),
        metadata=dict(metadata),
        generate=_opt_bool(body, "generate", True),
        append_mode=_opt_bool(body, "append_mode", False),
        safety_identifier=_opt_str(body, "safety_identifier"),
        prompt_cache_key=_opt_str(body, "prompt_cache_key"),
        user=_opt_str(body, "user"),
        stream=_opt_bool(body, "stream", False),
        background=_opt_bool(body, "background", False),
        idempotency_key=_opt_str(body, "idempotency_key"),
    )
    request.tool_choice = parse_tool_choice(body.get("tool_choice"))
    request.toolset = ToolSet.of(body.get("tools"), limits, last_tools)
    if isinstance(request.tool_choice, dict):
        name = request.tool_choice["name"]
        if name not in request.toolset.function_names:
            raise invalid("tool_choice.name", f"no function tool named '{name}' is declared.")
    request.input, _ = parse_input(body.get("input"), limits)
    parse_output_settings(request, body)
    return request


def parse_output_settings(request: CreateRequest, body: dict[str, Any]) -> None:
    """``text``, ``reasoning``, ``truncation``, ``include``, ``max_tool_calls``; refuses the
    hosted API's parameters that the server cannot honour (see ``core.params``)."""
    params.check_unsupported(body)
    request.text = params.parse_text(body.get("text"), check_schema)
    request.reasoning = params.parse_reasoning(body.get("reasoning"))
    request.truncation = params.parse_truncation(body.get("truncation"))
    request.include = params.parse_include(body.get("include"))
    request.max_tool_calls = params.parse_max_tool_calls(body.get("max_tool_calls"))


def parse_input(raw: Any, limits: Limits, *, where: str = "input") -> tuple[list[Item], int]:
    """Normalize the input (a string or a list of items); return the items and their size."""
    if raw is None:
        return [], 0
    if isinstance(raw, str):
        if len(raw) > limits.max_item_chars:
            raise _too_long(where, limits.max_item_chars, len(raw))
        return [_message("user", [{"type": "input_text", "text": raw}])], len(raw)
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


def _too_long(where: str, limit: int, got: int) -> ApiError:
    return invalid(
        where,
        f"string too long: at most {limit} characters, got {got}.",
        code="string_above_max_length",
    )


def _text(value: Any, where: str, limits: Limits, *, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        if value is None:
            raise missing(where)
        raise invalid(where, f"expected a string, got {type(value).__name__}.", code="invalid_type")
    if len(value) > limits.max_item_chars:
        raise _too_long(where, limits.max_item_chars, len(value))
    return value


def _message(role: str, content: list[JSONObject], **extra: JSONValue) -> MessageItem:
    """A message of a checked role and checked parts (the callers check them)."""
    item: JSONObject = {"type": "message", "role": role, "content": content}
    item.update({k: v for k, v in extra.items() if v is not None})
    return cast(MessageItem, item)


def _closed(value: Any, where: str, allowed: frozenset[str]) -> str | None:
    """An optional string that must be one of ``allowed``."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in allowed:
        shown = f"'{value}'" if isinstance(value, str) else f"a {type(value).__name__}"
        raise invalid(where, f"expected one of {', '.join(sorted(allowed))}; got {shown}.")
    return value


def _opt_text(entry: dict[str, Any], key: str, where: str) -> str | None:
    """An optional string field of an item (ids, phase, encrypted content)."""
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(
            f"{where}.{key}", f"expected a string, got {type(value).__name__}.", code="invalid_type"
        )
    return value


def _copy_keys(entry: dict[str, Any], item: JSONObject, where: str, keys: tuple[str, ...]) -> None:
    """Carry the optional ``id``/``status``/... fields over, checked."""
    for key in keys:
        if key == "status":
            value = _closed(entry.get(key), f"{where}.status", _ITEM_STATUSES)
        else:
            value = _opt_text(entry, key, where)
        if value:
            item[key] = value


def _arguments(value: Any, where: str, limits: Limits) -> str:
    """Function-call arguments: a string holding one JSON value (the model's output)."""
    text = _text(value, where, limits)
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        raise invalid(
            where, "expected a string of JSON (such as '{}'), as the model produces it."
        ) from None
    return text


def normalize_item(entry: Any, where: str, limits: Limits) -> tuple[Item, int]:
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
    if kind == "message":
        role = entry.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise invalid(f"{where}.role", "expected 'user', 'assistant', 'system' or 'developer'.")
        content = entry.get("content")
        size = 0
        parts: list[JSONObject] = []
        if isinstance(content, str):
            size = len(_text(content, f"{where}.content", limits))
            parts = [
                {"type": "output_text" if role == "assistant" else "input_text", "text": content}
            ]
            if role == "assistant":
                parts[0]["annotations"] = []
        elif isinstance(content, list):
            for p_index, part in enumerate(content):
                p_where = f"{where}.content[{p_index}]"
                p_type = part.get("type") if isinstance(part, dict) else None
                if not isinstance(p_type, str) or p_type not in _PART_TYPES:
                    raise invalid(
                        f"{p_where}.type",
                        "expected 'input_text', 'output_text', 'refusal' or 'input_image'.",
                    )
                assert isinstance(part, dict)
                if p_type == "refusal":
                    text = _text(part.get("refusal"), f"{p_where}.refusal", limits)
                    parts.append({"type": "refusal", "refusal": text})
                elif p_type == "input_image":
                    url = _text(part.get("image_url"), f"{p_where}.image_url", limits)
                    detail = _closed(
                        part.get("detail") or None, f"{p_where}.detail", _IMAGE_DETAILS
                    )
                    parts.append(
                        {"type": "input_image", "image_url": url, "detail": detail or "auto"}
                    )
                    text = ""
                else:
                    text = _text(part.get("text"), f"{p_where}.text", limits)
                    new_part: JSONObject = {"type": p_type, "text": text}
                    if p_type == "output_text":
                        annotations = part.get("annotations") or []
                        if not isinstance(annotations, list):
                            raise invalid(
                                f"{p_where}.annotations", "expected an array.", code="invalid_type"
                            )
                        new_part["annotations"] = annotations
                    parts.append(new_part)
                size += len(text)
        else:
            raise invalid(
                f"{where}.content",
                "expected a string or an array of content parts.",
                code="invalid_type",
            )
        extra: JSONObject = {}
        _copy_keys(entry, extra, where, ("id", "status", "phase"))
        return _message(role, parts, **extra), size
    if kind == "function_call":
        call_id = _text(entry.get("call_id"), f"{where}.call_id", limits)
        name = _text(entry.get("name"), f"{where}.name", limits)
        if entry.get("status") == "incomplete":  # cut short by max_output_tokens
            arguments = _text(entry.get("arguments"), f"{where}.arguments", limits)
        else:
            arguments = _arguments(entry.get("arguments"), f"{where}.arguments", limits)
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
    if kind == "function_call_output":
        call_id = _text(entry.get("call_id"), f"{where}.call_id", limits)
        if not call_id:
            raise missing(f"{where}.call_id")
        output = entry.get("output")
        if isinstance(output, list):
            texts = []
            for o_index, part in enumerate(output):
                if not isinstance(part, dict) or part.get("type") not in (
                    "input_text",
                    "output_text",
                ):
                    raise invalid(f"{where}.output[{o_index}]", "expected a text content part.")
                texts.append(_text(part.get("text"), f"{where}.output[{o_index}].text", limits))
            output = "".join(texts)
        output = _text(output, f"{where}.output", limits)
        item = {"type": "function_call_output", "call_id": call_id, "output": output}
        _copy_keys(entry, item, where, ("id", "status"))
        return cast(FunctionCallOutputItem, item), len(output)
    if kind == "reasoning":
        summary = entry.get("summary") or []
        if not isinstance(summary, list):
            raise invalid(f"{where}.summary", "expected an array.", code="invalid_type")
        parts = []
        size = 0
        for s_index, part in enumerate(summary):
            text = _text(
                part.get("text") if isinstance(part, dict) else None,
                f"{where}.summary[{s_index}].text",
                limits,
            )
            parts.append({"type": "summary_text", "text": text})
            size += len(text)
        item = {"type": "reasoning", "summary": parts}
        _copy_keys(entry, item, where, ("id", "encrypted_content", "status"))
        return cast(ReasoningItem, item), size
    if kind in _OPAQUE_ITEMS:
        return normalize_opaque_item(entry, kind, where, limits)
    if kind in _PASSTHROUGH_ITEMS:
        _check_passthrough(kind, entry, where, limits)
        item = dict(entry)
        size = sum(len(v) for v in item.values() if isinstance(v, str))
        if size > limits.max_item_chars:
            raise _too_long(where, limits.max_item_chars, size)
        return cast(PassthroughItem, item), size
    if kind is None:
        raise missing(f"{where}.type")
    raise invalid(f"{where}.type", f"unknown item type '{kind}'.")


def _check_passthrough(kind: str, entry: dict[str, Any], where: str, limits: Limits) -> None:
    """The fields the core itself reads from items it otherwise carries along unchanged."""
    if kind in ("custom_tool_call", "custom_tool_call_output"):
        call_id = _text(entry.get("call_id"), f"{where}.call_id", limits)
        if not call_id:
            raise missing(f"{where}.call_id")
    if kind == "custom_tool_call":
        if not _text(entry.get("name"), f"{where}.name", limits):
            raise missing(f"{where}.name")
        _text(entry.get("input"), f"{where}.input", limits, required=False)
    elif kind == "custom_tool_call_output":
        output = entry.get("output")
        if not isinstance(output, str | list):
            raise invalid(
                f"{where}.output",
                "expected a string or an array of content parts.",
                code="invalid_type",
            )
    elif kind == "additional_tools":
        tools = entry.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise invalid(f"{where}.tools", "expected an array of tools.", code="invalid_type")
    for key in ("id", "status"):
        if key == "status":
            _closed(entry.get(key), f"{where}.status", _ITEM_STATUSES)
        else:
            _opt_text(entry, key, where)


def normalize_opaque_item(
    entry: dict[str, Any], kind: str, where: str, limits: Limits
) -> tuple[Item, int]:
    """A ``compaction`` item: ``encrypted_content`` (required) and an optional ``id``.

    The token's integrity is checked against the server key before the item is rendered
    (``core.compaction``); here only its shape.
    """
    content = _text(entry.get("encrypted_content"), f"{where}.encrypted_content", limits)
    if not content:
        raise missing(f"{where}.encrypted_content")
    item: JSONObject = {"type": kind, "encrypted_content": content}
    for key in ("id", "created_by"):
        value = entry.get(key)
        if value is not None:
            item[key] = _text(value, f"{where}.{key}", limits)
    return cast(CompactionItem, item), len(content)
