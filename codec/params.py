"""Create parameters: a JSON create body <-> ``ResponseCreateParams``, both ways.

The client encodes the body it was given; the server decodes the message into the body of
POST /v1/responses, leaving out what the client did not set.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

from bidi_responses.schema import JSONObject
from bidi_responses.v1 import responses_pb2 as pb

from .depth import deep
from .items import canonical_item, item_to_dict, item_to_pb
from .settings import (
    reasoning_to_dict,
    reasoning_to_pb,
    text_to_dict,
    text_to_pb,
)
from .tools import (
    tool_choice_to_dict,
    tool_choice_to_pb,
    tools_to_dicts,
    write_tools,
)

# The optional scalar fields of ResponseCreateParams: present in JSON iff set in protobuf.
OptionalParam = Literal[
    "instructions",
    "previous_response_id",
    "store",
    "max_output_tokens",
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "generate",
    "append_mode",
    "safety_identifier",
    "prompt_cache_key",
    "user",
    "truncation",
    "max_tool_calls",
    "background",
    "idempotency_key",
]
OPTIONAL_PARAMS: tuple[OptionalParam, ...] = get_args(OptionalParam)
_OPTIONAL_NAMES = frozenset(OPTIONAL_PARAMS)


def params_to_dict(
    params: pb.ResponseCreateParams, tool_keys: Sequence[bytes] | None = None
) -> JSONObject:
    """Create parameters as the POST /v1/responses body (absent fields left out);
    ``tool_keys``: the tools' serialized messages, when the caller has them."""
    body: JSONObject = {"model": params.model, "input": [item_to_dict(i) for i in params.input]}
    # One pass over the fields that are set (a presence check per field costs more).
    for field, value in params.ListFields():
        name = field.name
        if name in _OPTIONAL_NAMES:
            body[name] = value
        elif name == "tools":
            body["tools"] = tools_to_dicts(value, tool_keys)
        elif name == "tool_choice":
            choice = tool_choice_to_dict(value)
            if choice is not None:
                body["tool_choice"] = choice
        elif name == "metadata":
            body["metadata"] = dict(value)
        elif name == "text":
            body["text"] = text_to_dict(value)
        elif name == "reasoning":
            body["reasoning"] = reasoning_to_dict(value)
        elif name == "include":
            body["include"] = list(value)
    return body


@deep
def params_to_pb(
    body: JSONObject,
    *,
    json_parameters: bool = False,
    into: pb.ResponseCreateParams | None = None,
) -> pb.ResponseCreateParams:
    """A JSON create body as ResponseCreateParams (the client side of ``params_to_dict``);
    ``json_parameters`` sends function schemas as JSON text (``parameters_json``). ``into``
    fills a field of the request being built (``request.response_create``), which spares
    copying the parameters into it (upb copies a message by serializing and parsing it)."""
    if into is None:
        params = pb.ResponseCreateParams(model=body.get("model", ""))
    else:
        params = into
        params.SetInParent()
        params.model = body.get("model", "")
    raw_input = body.get("input")
    if isinstance(raw_input, str):
        raw_input = [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": raw_input}],
            }
        ]
    for item in raw_input or ():
        params.input.append(item_to_pb(canonical_item(item)))
    tools = body.get("tools")
    if tools:
        write_tools(params, tools, json_parameters=json_parameters)
    if body.get("tool_choice") is not None:
        params.tool_choice.CopyFrom(tool_choice_to_pb(body["tool_choice"]))
    for name in OPTIONAL_PARAMS:
        if body.get(name) is not None:
            setattr(params, name, body[name])
    for key, value in (body.get("metadata") or {}).items():
        params.metadata[key] = value
    if isinstance(body.get("text"), dict):
        params.text.CopyFrom(text_to_pb(body["text"]))
    if isinstance(body.get("reasoning"), dict):
        params.reasoning.CopyFrom(reasoning_to_pb(body["reasoning"]))
    if body.get("include"):
        params.include.extend(body["include"])
    return params
