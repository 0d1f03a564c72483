"""The small objects a request sets and a Response reports, both ways: ``text`` (output
format), ``reasoning``, ``usage`` and the server's ``stats``."""

from __future__ import annotations

from bidi_responses.schema import JSONMapping, JSONObject
from bidi_responses.v1 import responses_pb2 as pb
from google.protobuf.message import Message

from .structs import fill_struct, restore_integers, struct_to_dict


def text_to_dict(text: pb.TextConfig) -> JSONObject:
    """A TextConfig as the JSON ``text`` object (as the server echoes it)."""
    result: JSONObject = {"format": {"type": "text"}}
    if text.HasField("format"):
        f = text.format
        fmt: JSONObject = {"type": f.type or "text"}
        if f.type == "json_schema":
            if f.name:
                fmt["name"] = f.name
            if f.HasField("schema"):
                fmt["schema"] = restore_integers(struct_to_dict(f.schema))
            if f.HasField("description"):
                fmt["description"] = f.description
            fmt["strict"] = f.strict if f.HasField("strict") else None
        result["format"] = fmt
    if text.HasField("verbosity"):
        result["verbosity"] = text.verbosity
    return result


def text_to_pb(text: JSONMapping) -> pb.TextConfig:
    """The JSON ``text`` object as a TextConfig."""
    config = pb.TextConfig()
    fmt = text.get("format")
    if isinstance(fmt, dict):
        config.format.type = str(fmt.get("type") or "")
        if fmt.get("name") is not None:
            config.format.name = str(fmt["name"])
        if fmt.get("description") is not None:
            config.format.description = str(fmt["description"])
        if isinstance(fmt.get("schema"), dict):
            fill_struct(config.format.schema, fmt["schema"])
        if fmt.get("strict") is not None:
            config.format.strict = bool(fmt["strict"])
    if text.get("verbosity") is not None:
        config.verbosity = str(text["verbosity"])
    return config


def reasoning_to_dict(reasoning: pb.ReasoningConfig) -> JSONObject:
    """A ReasoningConfig as the JSON ``reasoning`` object."""
    return {
        "effort": reasoning.effort if reasoning.HasField("effort") else None,
        "summary": reasoning.summary if reasoning.HasField("summary") else None,
    }


def reasoning_to_pb(reasoning: JSONMapping) -> pb.ReasoningConfig:
    """The JSON ``reasoning`` object as a ReasoningConfig."""
    config = pb.ReasoningConfig()
    if reasoning.get("effort") is not None:
        config.effort = str(reasoning["effort"])
    if reasoning.get("summary") is not None:
        config.summary = str(reasoning["summary"])
    return config


def usage_to_dict(u: pb.Usage) -> JSONObject:
    """A Usage as the JSON ``usage`` object."""
    return {
        "input_tokens": u.input_tokens,
        "input_tokens_details": {"cached_tokens": u.input_tokens_details.cached_tokens},
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": u.output_tokens_details.reasoning_tokens},
        "total_tokens": u.total_tokens,
    }


def usage_to_pb(usage: JSONMapping) -> pb.Usage:
    """The JSON ``usage`` object as a Usage."""
    return pb.Usage(
        input_tokens=usage["input_tokens"],
        input_tokens_details=pb.InputTokensDetails(
            cached_tokens=usage["input_tokens_details"]["cached_tokens"]
        ),
        output_tokens=usage["output_tokens"],
        output_tokens_details=pb.OutputTokensDetails(
            reasoning_tokens=usage["output_tokens_details"]["reasoning_tokens"]
        ),
        total_tokens=usage["total_tokens"],
    )


def stats_to_dict(stats: pb.ResponseStats) -> JSONObject:
    """The server's per-response counters as JSON."""
    return flat_message_to_dict(stats)


def stats_to_pb(stats: JSONMapping) -> pb.ResponseStats:
    """The server's per-response counters as a ResponseStats."""
    return pb.ResponseStats(**stats)


def flat_message_to_dict(message: Message) -> JSONObject:
    """A message of scalars and scalar maps as a dict with native numbers.

    (``json_format`` would turn 64-bit integers into strings, as proto3 JSON requires.)
    """
    result: JSONObject = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        result[field.name] = dict(value) if field.message_type is not None else value
    return result
