"""The create request: parsed from a JSON-shaped body and checked field by field.

Every transport hands the core the same JSON-shaped dict (the body of POST /v1/responses, the
WebSocket ``response.create`` frame, or the gRPC message mapped by name). Parsing checks only
what the request carries: the new input, never the cached history.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bidi_responses.schema import (
    Item,
    JSONObject,
    JSONValue,
    ReasoningConfig,
    TextConfig,
    ToolChoice,
)

from ...config import Limits
from . import params
from .errors import ApiError, invalid, shown
from .fields import opt_bool, opt_number, opt_str, required_model
from .input_items import parse_input
from .jsonshape import plain_numbers
from .tools import NO_TOOLS, ToolSet, check_schema, parse_tool_choice


@dataclass(slots=True)
class CreateRequest:
    """A checked create request. ``input`` holds normalized items (see ``input_items``)."""

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
    background: bool = False
    # Output settings (see ``core.api.params``), normalized as the Response echoes them.
    text: TextConfig = field(default_factory=lambda: params.TEXT_DEFAULT.copy())
    reasoning: ReasoningConfig | None = None
    truncation: str = "disabled"
    max_tool_calls: int | None = None
    # Names the response this turn creates, so a retried turn is not run twice (idempotency.py).
    idempotency_key: str | None = None

    @property
    def tools(self) -> list[JSONObject]:
        """The checked tools, as the Response echoes them."""
        return self.toolset.tools

    def output_format(self) -> JSONObject | None:
        """The structured-output format with integral numbers as integers (a gRPC ``Struct``
        makes every number a double) and its keys in the client's order, as the model must
        see it."""
        fmt = params.response_format(self.text)
        return plain_numbers(fmt) if fmt is not None else None


def parse_create(
    body: JSONValue, limits: Limits, last_tools: ToolSet | None = None
) -> CreateRequest:
    """Check a create body and return a CreateRequest; raise ApiError naming the bad field."""
    if not isinstance(body, dict):
        raise ApiError("The request body must be a JSON object.", code="invalid_type")
    model = required_model(body)

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

    # ``stream`` is the HTTP transport's choice of framing; here it is only checked.
    opt_bool(body, "stream", False)
    request = CreateRequest(
        model=model,
        input=[],
        instructions=opt_str(body, "instructions"),
        previous_response_id=opt_str(body, "previous_response_id") or None,
        store=opt_bool(body, "store", True),
        max_output_tokens=max_output,
        temperature=opt_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=opt_number(body, "top_p", 1.0, 0.0, 1.0),
        parallel_tool_calls=opt_bool(body, "parallel_tool_calls", True),
        metadata=dict(metadata),
        generate=opt_bool(body, "generate", True),
        append_mode=opt_bool(body, "append_mode", False),
        safety_identifier=opt_str(body, "safety_identifier"),
        prompt_cache_key=opt_str(body, "prompt_cache_key"),
        user=opt_str(body, "user"),
        background=opt_bool(body, "background", False),
        idempotency_key=opt_str(body, "idempotency_key"),
    )
    request.tool_choice = parse_tool_choice(body.get("tool_choice"))
    request.toolset = ToolSet.of(body.get("tools"), limits, last_tools)
    if isinstance(request.tool_choice, dict):
        name = request.tool_choice["name"]
        if name not in request.toolset.function_names:
            raise invalid(
                "tool_choice.name", f"no function tool named '{shown(name)}' is declared."
            )
    request.input, _ = parse_input(body.get("input"), limits)
    parse_output_settings(request, body)
    return request


def parse_output_settings(request: CreateRequest, body: JSONObject) -> None:
    """``text``, ``reasoning``, ``truncation``, ``include``, ``max_tool_calls``; refuses the
    hosted API's parameters that the server cannot honour (see ``core.api.params``)."""
    params.check_unsupported(body)
    request.text = params.parse_text(body.get("text"), check_schema)
    request.reasoning = params.parse_reasoning(body.get("reasoning"))
    request.truncation = params.parse_truncation(body.get("truncation"))
    params.parse_include(body.get("include"))  # checked; every allowed value is implied
    request.max_tool_calls = params.parse_max_tool_calls(body.get("max_tool_calls"))
