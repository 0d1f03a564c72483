"""Conversation items and their content parts: JSON <-> ``Item`` / ``ContentPart``.

JSON's ``type`` discriminator is the protobuf ``oneof`` case (``"function_call"`` <->
``Item.function_call``); kinds without a typed case travel whole as ``Item.other``.

Decoding copies what the wire holds and checks nothing, so ``item_to_dict`` gives free JSON: a
client's input on the server is checked by the core next, and input handed back (a refused
steer) is the client's own. The items a server sends are the API's ``Item`` (its core built or
checked each one): ``checked_item_to_dict`` reads them as that type.
"""

from __future__ import annotations

from typing import cast

from bidi_responses.schema import Item, JSONMapping, JSONObject
from bidi_responses.v1 import responses_pb2 as pb

from .depth import deep
from .structs import dict_to_struct, struct_to_dict


def _set_present(result: JSONObject, **fields: str) -> JSONObject:
    """Add the fields that are set: proto3 strings are "" when absent, and JSON leaves them out."""
    for key, value in fields.items():
        if value:
            result[key] = value
    return result


def part_to_dict(part: pb.ContentPart) -> JSONObject:
    """A ContentPart as the JSON content part (an unset oneof gives ``{}``)."""
    kind = part.WhichOneof("part")
    if kind == "input_text":
        return {"type": "input_text", "text": part.input_text.text}
    if kind == "output_text":
        return {
            "type": "output_text",
            "text": part.output_text.text,
            "annotations": [struct_to_dict(a) for a in part.output_text.annotations],
        }
    if kind == "refusal":
        return {"type": "refusal", "refusal": part.refusal.refusal}
    if kind == "input_image":
        return {
            "type": "input_image",
            "image_url": part.input_image.image_url,
            "detail": part.input_image.detail or "auto",
        }
    return {}


@deep
def part_to_pb(part: JSONMapping) -> pb.ContentPart:
    """A JSON content part as a ContentPart."""
    kind = part.get("type")
    if kind == "output_text":
        return pb.ContentPart(
            output_text=pb.OutputText(
                text=part.get("text", ""),
                annotations=[dict_to_struct(a) for a in part.get("annotations") or ()],
            )
        )
    if kind == "input_text":
        return pb.ContentPart(input_text=pb.InputText(text=part.get("text", "")))
    if kind == "refusal":
        return pb.ContentPart(refusal=pb.Refusal(refusal=part.get("refusal", "")))
    if kind == "input_image":
        return pb.ContentPart(
            input_image=pb.InputImage(
                image_url=part.get("image_url", ""), detail=part.get("detail") or ""
            )
        )
    return pb.ContentPart()


def item_to_dict(item: pb.Item) -> JSONObject:
    """An Item message as the JSON item, as sent (an unset oneof gives ``{}``, rejected by the
    core); ``checked_item_to_dict`` for the items a server sends."""
    kind = item.WhichOneof("item")
    if kind == "message":
        m = item.message
        result: JSONObject = {
            "type": "message",
            "role": m.role,
            "content": [part_to_dict(p) for p in m.content],
        }
        return _set_present(result, id=m.id, status=m.status, phase=m.phase)
    if kind == "function_call":
        return function_call_to_dict(item.function_call)
    if kind == "function_call_output":
        o = item.function_call_output
        result = {"type": "function_call_output", "call_id": o.call_id, "output": o.output}
        return _set_present(result, id=o.id, status=o.status)
    if kind == "reasoning":
        r = item.reasoning
        result = {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": s.text} for s in r.summary],
        }
        return _set_present(result, id=r.id, encrypted_content=r.encrypted_content)
    if kind == "compaction":
        c = item.compaction
        result = {"type": "compaction", "encrypted_content": c.encrypted_content}
        return _set_present(result, id=c.id, created_by=c.created_by)
    if kind == "other":
        return struct_to_dict(item.other)
    return {}


def checked_item_to_dict(item: pb.Item) -> Item:
    """An item a server sent (its output, a stored input item, a compaction) as the API's
    ``Item``: the server's core built or checked it, so it is one of the API's kinds with the
    API's values. With ``response_to_dict``, the codec's only assertion of the API's types,
    both on the server's word; an item of a kind newer than this proto decodes as ``{}``, so
    read ``type`` with ``.get`` where a newer server may be met."""
    return cast(Item, item_to_dict(item))


def function_call_to_dict(call: pb.FunctionCallItem) -> JSONObject:
    """A FunctionCallItem as the JSON function_call item."""
    result: JSONObject = {
        "type": "function_call",
        "call_id": call.call_id,
        "name": call.name,
        "arguments": call.arguments,
    }
    return _set_present(result, id=call.id, status=call.status)


def function_call_to_pb(item: JSONMapping) -> pb.FunctionCallItem:
    """A JSON function_call item as a FunctionCallItem."""
    return pb.FunctionCallItem(
        id=item.get("id", ""),
        call_id=item["call_id"],
        name=item["name"],
        arguments=item["arguments"],
        status=item.get("status", ""),
    )


@deep
def item_to_pb(item: JSONMapping) -> pb.Item:
    """A JSON item as an Item (kinds without a typed case travel as ``other``)."""
    kind = item.get("type")
    if kind == "message":
        return pb.Item(
            message=pb.MessageItem(
                id=item.get("id", ""),
                role=item["role"],
                content=[part_to_pb(p) for p in item["content"]],
                status=item.get("status", ""),
                phase=item.get("phase") or "",
            )
        )
    if kind == "function_call":
        return pb.Item(function_call=function_call_to_pb(item))
    if kind == "function_call_output":
        return pb.Item(
            function_call_output=pb.FunctionCallOutputItem(
                id=item.get("id", ""),
                call_id=item["call_id"],
                output=item["output"],
                status=item.get("status", ""),
            )
        )
    if kind == "compaction":
        return pb.Item(
            compaction=pb.CompactionItem(
                id=item.get("id") or "",
                encrypted_content=item.get("encrypted_content") or "",
                created_by=item.get("created_by") or "",
            )
        )
    if kind == "reasoning":
        return pb.Item(
            reasoning=pb.ReasoningItem(
                id=item.get("id", ""),
                summary=[
                    pb.ReasoningSummary(type="summary_text", text=s["text"])
                    for s in item.get("summary", ())
                ],
                encrypted_content=item.get("encrypted_content") or "",
                status=item.get("status", ""),
            )
        )
    return pb.Item(other=dict_to_struct(item))


def canonical_item(item: JSONMapping) -> JSONMapping:
    """Fill the shorthand forms JSON allows (``{"role","content":"text"}``); an ``Item`` comes
    back as it is."""
    if item.get("type") is None and "role" in item:
        item = {"type": "message", **item}
    if item.get("type") == "message" and isinstance(item.get("content"), str):
        part_type = "output_text" if item.get("role") == "assistant" else "input_text"
        item = {**item, "content": [{"type": part_type, "text": item["content"]}]}
    return item
