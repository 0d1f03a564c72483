"""The Response object: JSON <-> ``Response``, both ways.

The server sends a response in parts that it serializes separately: the fields that change
over the response's life (``response_progress_to_pb``) and those that echo the request, the
same in every snapshot (``response_echo_to_pb``), so the echo is serialized once per response.
"""

from __future__ import annotations

from typing import Literal, cast

from bidi_responses.schema import JSONMapping, JSONObject, JSONValue, ResponseObject
from bidi_responses.v1 import responses_pb2 as pb

from .depth import deep
from .items import item_to_dict, item_to_pb
from .settings import (
    reasoning_to_dict,
    reasoning_to_pb,
    stats_to_dict,
    stats_to_pb,
    text_to_dict,
    text_to_pb,
    usage_to_dict,
    usage_to_pb,
)
from .tools import (
    tool_choice_to_dict,
    tool_choice_to_pb,
    tool_echoes_to_dicts,
    tools_to_pb,
)

# The optional echoed fields of a Response, set only when not null (slim snapshots leave the
# instructions out with the tools).
_ECHO_FIELDS = ("max_output_tokens", "safety_identifier", "prompt_cache_key", "max_tool_calls")
_ECHO_FIELDS_FULL = (*_ECHO_FIELDS, "instructions")


@deep
def response_to_pb(
    r: JSONMapping, *, slim: bool = False, json_parameters: bool = False
) -> pb.Response:
    """A Response object (``slim``: without the echoed instructions and tools;
    ``json_parameters``: function tools' schemas as JSON text)."""
    response = response_progress_to_pb(r, slim)
    response.MergeFrom(response_echo_to_pb(r, slim, json_parameters))
    return response


def response_echo_to_pb(r: JSONMapping, slim: bool, json_parameters: bool = False) -> pb.Response:
    """The fields that echo the request: the same in every snapshot of a response."""
    response = pb.Response(
        object="response",
        model=r["model"],
        tools=None if slim else tools_to_pb(r["tools"], json_parameters=json_parameters),
        tool_choice=tool_choice_to_pb(r["tool_choice"]),
        truncation=r["truncation"],
        parallel_tool_calls=r["parallel_tool_calls"],
        temperature=r["temperature"],
        top_p=r["top_p"],
        store=r["store"],
        background=r["background"],
        service_tier=r["service_tier"],
        metadata=r["metadata"],
        presence_penalty=r["presence_penalty"],
        frequency_penalty=r["frequency_penalty"],
        top_logprobs=r["top_logprobs"],
    )
    if r.get("text"):
        response.text.CopyFrom(text_to_pb(r["text"]))
    if r.get("reasoning") is not None:
        response.reasoning.CopyFrom(reasoning_to_pb(r["reasoning"]))
    for name in _ECHO_FIELDS if slim else _ECHO_FIELDS_FULL:
        value = r.get(name)
        if value is not None:
            setattr(response, name, value)
    return response


def response_progress_to_pb(r: JSONMapping, slim: bool) -> pb.Response:
    """The fields that change over a response's life."""
    response = pb.Response(
        id=r["id"],
        created_at=r["created_at"],
        status=r["status"],
        output=[item_to_pb(i) for i in r["output"]],
        slim=slim,
        safety_flags=[pb.SafetyFlag(**f) for f in r.get("safety_flags") or ()],
    )
    if r.get("completed_at") is not None:
        response.completed_at = r["completed_at"]
    if r.get("previous_response_id") is not None:
        response.previous_response_id = r["previous_response_id"]
    if r.get("incomplete_details"):
        response.incomplete_details.reason = r["incomplete_details"]["reason"]
    if r.get("error"):
        response.error.code = r["error"].get("code") or ""
        response.error.message = r["error"].get("message") or ""
    if r.get("usage"):
        response.usage.CopyFrom(usage_to_pb(r["usage"]))
    if r.get("stats"):
        response.stats.CopyFrom(stats_to_pb(r["stats"]))
    return response


def response_to_dict(r: pb.Response) -> ResponseObject:
    """A Response message as the JSON Response object.

    Typed as the API's ``ResponseObject`` on the server's word, as ``checked_item_to_dict``
    reads its items: a server's core built it. Only a server sends a Response."""
    result: JSONObject = {
        "id": r.id,
        "object": r.object or "response",
        "created_at": r.created_at,
        "completed_at": _optional(r, "completed_at"),
        "status": r.status,
        "incomplete_details": (
            {"reason": r.incomplete_details.reason} if r.HasField("incomplete_details") else None
        ),
        "model": r.model,
        "previous_response_id": _optional(r, "previous_response_id"),
        "instructions": _optional(r, "instructions"),
        "output": [item_to_dict(i) for i in r.output],
        "error": (
            {"code": r.error.code, "message": r.error.message} if r.HasField("error") else None
        ),
        "tools": tool_echoes_to_dicts(r.tools),
        "tool_choice": tool_choice_to_dict(r.tool_choice) or "auto",
        "truncation": r.truncation,
        "parallel_tool_calls": r.parallel_tool_calls,
        "text": (text_to_dict(r.text) if r.HasField("text") else {"format": {"type": "text"}}),
        "top_p": r.top_p,
        "presence_penalty": r.presence_penalty,
        "frequency_penalty": r.frequency_penalty,
        "temperature": r.temperature,
        "top_logprobs": r.top_logprobs,
        "reasoning": reasoning_to_dict(r.reasoning) if r.HasField("reasoning") else None,
        "usage": usage_to_dict(r.usage) if r.HasField("usage") else None,
        "max_output_tokens": _optional(r, "max_output_tokens"),
        "max_tool_calls": _optional(r, "max_tool_calls"),
        "store": r.store,
        "background": r.background,
        "service_tier": r.service_tier,
        "safety_identifier": _optional(r, "safety_identifier"),
        "prompt_cache_key": _optional(r, "prompt_cache_key"),
        "metadata": dict(r.metadata),
        "safety_flags": [
            {"classifier": f.classifier, "code": f.code, "param": f.param, "message": f.message}
            for f in r.safety_flags
        ],
    }
    if r.HasField("stats"):
        result["stats"] = stats_to_dict(r.stats)
    return cast(ResponseObject, result)


_OptionalField = Literal[
    "completed_at",
    "previous_response_id",
    "instructions",
    "max_output_tokens",
    "max_tool_calls",
    "safety_identifier",
    "prompt_cache_key",
]


def _optional(message: pb.Response, name: _OptionalField) -> JSONValue:
    """An optional field's value, None when unset."""
    return getattr(message, name) if message.HasField(name) else None
