"""The create parameters beyond the conversation: output format, reasoning, truncation, include.

Each is checked here, normalized to the shape the Response object echoes, and either honoured
or refused with a 400 naming it: a client must never believe a setting took effect when it
did not. ``text.format`` (structured outputs) is passed to the engine and rendered into the
prompt; the others are echoed as given.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal, get_args

from bidi_responses.schema import (
    JSONObject,
    JSONSchemaFormat,
    JSONValue,
    ReasoningConfig,
    TextConfig,
    TextFormat,
)

from .errors import ApiError, invalid, missing, shown
from .fields import closed, json_type

#: Checks a JSON schema, raising ApiError naming ``where`` (``tools.check_schema``).
SchemaCheck = Callable[[JSONValue, str], None]

_FORMAT_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# The closed sets, in the order error messages list them (read by ``fields.closed``).
Verbosity = Literal["low", "medium", "high"]
Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
Summary = Literal["auto", "concise", "detailed"]
FormatType = Literal["text", "json_object", "json_schema"]
_VERBOSITY: tuple[Verbosity, ...] = get_args(Verbosity)
_EFFORT: tuple[Effort, ...] = get_args(Effort)
_SUMMARY: tuple[Summary, ...] = get_args(Summary)
_TRUNCATION = ("auto", "disabled")
_FORMAT_TYPES: tuple[FormatType, ...] = get_args(FormatType)
# What `include` may ask for. Each is optional output ("include it when there is some") about
# items these engines never produce (hosted tools, encrypted reasoning) or that the store keeps
# anyway (input image URLs), so accepting them promises nothing the response then lacks.
# Log probabilities would be a promise: they are refused.
_INCLUDE = frozenset(
    {
        "reasoning.encrypted_content",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "code_interpreter_call.outputs",
    }
)
# Parameters of the hosted API that this server cannot honour: each is refused by name.
_UNSUPPORTED = {
    "conversation": "conversations are not served; chain with 'previous_response_id'.",
    "prompt": "prompt templates are not served; send 'instructions' and 'input'.",
}

TEXT_DEFAULT: TextConfig = {"format": {"type": "text"}}


def check_unsupported(body: JSONObject) -> None:
    """Refuse hosted-API parameters the server cannot honour, naming them."""
    for name, reason in _UNSUPPORTED.items():
        if body.get(name) is not None:
            raise ApiError(
                f"Unsupported parameter: '{name}': {reason}",
                code="unsupported_parameter",
                param=name,
            )
    top_logprobs = body.get("top_logprobs")
    if top_logprobs not in (None, 0):
        raise ApiError(
            "Unsupported parameter: 'top_logprobs': the engines do not report log probabilities.",
            code="unsupported_parameter",
            param="top_logprobs",
        )


def parse_text(value: JSONValue, check_schema: SchemaCheck) -> TextConfig:
    """``text``: ``{"format": {...}, "verbosity": ...}``, normalized for the echo."""
    if value is None:
        return TEXT_DEFAULT
    if not isinstance(value, dict):
        raise invalid("text", "expected an object.", code="invalid_type")
    result: TextConfig = {"format": parse_format(value.get("format"), check_schema)}
    verbosity = closed(value.get("verbosity"), "text.verbosity", _VERBOSITY)
    if verbosity is not None:
        result["verbosity"] = verbosity
    return result


def parse_format(value: JSONValue, check_schema: SchemaCheck) -> TextFormat:
    """``text.format``: ``text``, ``json_object`` or ``json_schema`` (strict or not)."""
    where = "text.format"
    if value is None:
        return {"type": "text"}
    if not isinstance(value, dict):
        raise invalid(where, "expected an object.", code="invalid_type")
    kind = closed(value.get("type"), f"{where}.type", _FORMAT_TYPES, required=True)
    if kind == "text" or kind == "json_object":
        return {"type": kind}
    name = value.get("name")
    if name is None:
        raise missing(f"{where}.name")
    if not isinstance(name, str) or not _FORMAT_NAME.match(name):
        raise invalid(f"{where}.name", "expected 1-64 characters of [A-Za-z0-9_-].")
    description = value.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid(f"{where}.description", "expected a string.", code="invalid_type")
    strict = value.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid(f"{where}.strict", "expected a boolean.", code="invalid_type")
    schema = value.get("schema")
    if schema is None:
        raise missing(f"{where}.schema")
    if not isinstance(schema, dict):
        raise invalid(f"{where}.schema", "expected a JSON schema object.", code="invalid_type")
    try:
        check_schema(schema, f"{where}.schema")
    except ApiError as error:
        # The shared checker speaks of function parameters; this is an output schema.
        if error.code == "invalid_function_parameters":
            error.code = "invalid_json_schema"
        raise
    if schema.get("type") != "object":
        raise invalid(f"{where}.schema.type", "the root of the schema must be of type 'object'.")
    _check_refs(schema, f"{where}.schema", schema)
    if strict:
        _check_strict(schema, f"{where}.schema", schema)
    result: JSONSchemaFormat
    if description is not None:
        result = {
            "type": "json_schema",
            "name": name,
            "schema": schema,
            "description": description,
            "strict": strict,
        }
    else:
        result = {"type": "json_schema", "name": name, "schema": schema, "strict": strict}
    return result


def _check_refs(value: JSONValue, where: str, root: JSONObject, depth: int = 0) -> None:
    """Every ``$ref`` is local (``#/...``) and names a part of this schema."""
    if depth > 64:
        raise invalid(where, "schema nesting is deeper than 64 levels.", code="invalid_json_schema")
    if isinstance(value, list):
        for index, sub in enumerate(value):
            _check_refs(sub, f"{where}[{index}]", root, depth + 1)
        return
    if not isinstance(value, dict):
        return
    ref = value.get("$ref")
    if ref is not None:
        target: JSONValue = root
        if isinstance(ref, str) and ref.startswith("#"):
            for part in ref[1:].split("/"):
                if not part:
                    continue
                key = part.replace("~1", "/").replace("~0", "~")
                target = target.get(key) if isinstance(target, dict) else None
        if not isinstance(ref, str) or not ref.startswith("#") or not isinstance(target, dict):
            raise invalid(
                f"{where}.$ref",
                f"{_quoted(ref)} does not name a part of this schema (only local references work).",
                code="invalid_json_schema",
            )
    for key, sub in value.items():
        if key not in ("enum", "const", "default", "examples"):
            _check_refs(sub, f"{where}.{key}", root, depth + 1)


def _check_strict(schema: JSONValue, where: str, root: JSONObject, depth: int = 0) -> None:
    """Strict mode's rules: every object closes its properties and requires all of them.

    Walks the keywords the general checks do not (``anyOf``, ``$defs``, ...), so each is
    checked for its shape here before it is read.
    """
    if depth > 32 or not isinstance(schema, dict):
        return
    if "$ref" in schema and isinstance(schema["$ref"], str):
        return  # its target is checked where it is defined ($defs)
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    properties = _schema_map(schema, "properties", where)
    if "object" in kinds or properties:
        if schema.get("additionalProperties") is not False:
            raise invalid(
                f"{where}.additionalProperties",
                "strict mode requires 'additionalProperties': false on every object.",
                code="invalid_json_schema",
            )
        required = schema.get("required") or []
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise invalid(
                f"{where}.required",
                "expected an array of property names.",
                code="invalid_json_schema",
            )
        absent = [name for name in properties if name not in required]
        if absent:
            raise invalid(
                f"{where}.required",
                "strict mode requires every property to be required; missing: "
                f"{shown(', '.join(absent))}.",
                code="invalid_json_schema",
            )
        for name, sub in properties.items():
            _check_strict(sub, f"{where}.properties.{name}", root, depth + 1)
    if isinstance(schema.get("items"), dict):
        _check_strict(schema["items"], f"{where}.items", root, depth + 1)
    for key in ("anyOf", "allOf"):
        subs = schema.get(key)
        if subs is None:
            continue
        if not isinstance(subs, list):
            raise invalid(
                f"{where}.{key}", "expected an array of schemas.", code="invalid_json_schema"
            )
        for index, sub in enumerate(subs):
            _check_strict(sub, f"{where}.{key}[{index}]", root, depth + 1)
    for key in ("$defs", "definitions"):
        for name, sub in _schema_map(schema, key, where).items():
            _check_strict(sub, f"{where}.{key}.{name}", root, depth + 1)


def _schema_map(schema: JSONObject, key: str, where: str) -> JSONObject:
    """A keyword whose value maps names to schemas (``properties``, ``$defs``); {} if absent."""
    value = schema.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(
            f"{where}.{key}",
            f"expected an object, got {json_type(value)}.",
            code="invalid_json_schema",
        )
    return value


def _quoted(value: JSONValue) -> str:
    """A client value as a message quotes it: a string bounded, anything else by its type."""
    return f"'{shown(value)}'" if isinstance(value, str) else json_type(value)


def parse_reasoning(value: JSONValue) -> ReasoningConfig | None:
    """``reasoning``: ``{"effort", "summary"}``, echoed with both keys (null when unset)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid("reasoning", "expected an object.", code="invalid_type")
    effort = closed(value.get("effort"), "reasoning.effort", _EFFORT)
    # "generate_summary" is the older spelling of "summary".
    key = "summary" if "summary" in value else "generate_summary"
    summary = closed(value.get(key), f"reasoning.{key}", _SUMMARY)
    return {"effort": effort, "summary": summary}


def parse_truncation(value: JSONValue) -> str:
    """``truncation``: ``auto`` or ``disabled`` (default).

    The engines have no context window to overflow, so ``auto`` never needs to drop an item:
    echoing it is faithful.
    """
    return closed(value, "truncation", _TRUNCATION) or "disabled"


def parse_include(value: JSONValue) -> list[str]:
    """``include``: extra output to include when present."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise invalid("include", "expected an array of strings.", code="invalid_type")
    for index, entry in enumerate(value):
        if entry == "message.output_text.logprobs":
            raise ApiError(
                f"Unsupported value: 'include[{index}]': the engines do not report log "
                "probabilities.",
                code="unsupported_value",
                param=f"include[{index}]",
            )
        closed(entry, f"include[{index}]", _INCLUDE)
    return list(value)


def parse_max_tool_calls(value: JSONValue) -> int | None:
    """``max_tool_calls``: a bound on built-in tool calls, which the engines never make."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid("max_tool_calls", "expected an integer >= 1.")
    return value


def response_format(text: TextConfig) -> TextFormat | None:
    """The structured-output format the engine must follow, or None for free text."""
    fmt = text.get("format")
    return fmt if fmt is not None and fmt["type"] in ("json_schema", "json_object") else None
