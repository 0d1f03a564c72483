"""Protobuf wire framing written by hand, for the streaming hot path.

A serialized message is its fields' encodings in any order, and a message field is its tag,
its length and the sub-message's bytes. So the streaming path builds bytes, not messages:
a batch is the events' bytes framed as ``EventBatch.events`` (no copy of each event into a
container message), and a snapshot's request echo is serialized once per response instead of
once per snapshot. The gRPC transport sends these bytes as they are; any protobuf parser reads
them as the same messages.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from bidi_responses.v1 import responses_pb2 as pb
from google.protobuf.message import Message

#: Wire type of varints (tag & 7).
VARINT = 0
#: Wire type of length-delimited fields: sub-messages, strings, bytes.
LENGTH_DELIMITED = 2


def exact(data: bytes) -> bytes:
    """A copy of ``data`` that holds only its own bytes, for keeping: ``orjson.dumps`` returns
    bytes inside a buffer of at least 4 KiB, and a cache of its results would hold that much
    per entry (measured: ~4,100 bytes retained for a 111-byte result)."""
    return bytes(memoryview(data))


#: Each one-byte varint, by value.
ONE_BYTE = tuple(bytes((b,)) for b in range(0x80))
# Every two-byte varint (128 to 16383: most lengths, counts and sequence numbers), two bytes
# each, by value: a slice costs half of building one (32 KiB).
_TWO_BYTES = b"".join(bytes((v & 0x7F | 0x80, v >> 7)) for v in range(1 << 14))
_UINT64 = (1 << 64) - 1


def varint(value: int) -> bytes:
    """``value`` as a varint; negative integers take ten bytes, as upb writes int32/int64.

    Unrolled up to five bytes: lengths, sequence numbers, token counts, timestamps."""
    if 0 <= value < 1 << 7:
        return ONE_BYTE[value]
    if 0 < value < 1 << 14:
        return _TWO_BYTES[2 * value : 2 * value + 2]
    if 0 < value < 1 << 21:
        return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14))
    if 0 < value < 1 << 35:
        if value < 1 << 28:
            return bytes(
                (
                    value & 0x7F | 0x80,
                    value >> 7 & 0x7F | 0x80,
                    value >> 14 & 0x7F | 0x80,
                    value >> 21,
                )
            )
        return bytes(
            (
                value & 0x7F | 0x80,
                value >> 7 & 0x7F | 0x80,
                value >> 14 & 0x7F | 0x80,
                value >> 21 & 0x7F | 0x80,
                value >> 28,
            )
        )
    if not -(1 << 63) <= value < 1 << 64:
        raise ValueError(f"{value} does not fit a 64-bit field")
    value &= _UINT64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the offset after it; IndexError when it runs off the end."""
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


@functools.cache  # a message has few fields, and the streaming path frames the same ones
def tag(number: int, wire_type: int) -> bytes:
    """The encoded key of field ``number``."""
    return varint(number << 3 | wire_type)


def field_number(message_class: type[Message], name: str) -> int:
    """The field number of ``name`` in ``message_class``."""
    number: int = message_class.DESCRIPTOR.fields_by_name[name].number
    return number


def field_bytes(number: int, payload: bytes) -> bytes:
    """A length-delimited field (a sub-message or a string): tag, length, payload."""
    return tag(number, LENGTH_DELIMITED) + varint(len(payload)) + payload


_BATCH_FIELD = field_number(pb.ConnectResponse, "batch")
_BATCH_EVENTS_FIELD = field_number(pb.EventBatch, "events")
#: ``CreateResponseResponse.event``: the field each event of a unary-stream call travels in.
EVENT_FIELD = field_number(pb.CreateResponseResponse, "event")


def batch_bytes(events: Sequence[bytes]) -> bytes:
    """Serialized ``ConnectResponse{batch: {events}}`` from serialized events."""
    return field_bytes(_BATCH_FIELD, b"".join(field_bytes(_BATCH_EVENTS_FIELD, e) for e in events))


def batch_messages(events: Sequence[bytes], max_events: int, max_bytes: int) -> list[bytes]:
    """Serialized events ready together as few messages, in order: ``batch`` messages of at
    most ``max_events`` events and about ``max_bytes`` (a larger event travels alone); a run
    of one event stays a plain single-event message."""
    out: list[bytes] = []
    run: list[bytes] = []
    size = 0
    for event in events:
        if run and (size + len(event) > max_bytes or len(run) >= max_events):
            out.append(run[0] if len(run) == 1 else batch_bytes(run))
            run, size = [], 0
        run.append(event)
        size += len(event)
    if run:
        out.append(run[0] if len(run) == 1 else batch_bytes(run))
    return out


def unbatch(message: pb.ConnectResponse) -> Sequence[pb.ConnectResponse]:
    """The events a message carries: the batch's events, or the message itself."""
    if message.WhichOneof("event") == "batch":
        return message.batch.events
    return (message,)


def wire_bytes(message: bytes | Message) -> bytes:
    """The response serializer of the streaming calls: bytes pass through, messages are
    serialized."""
    if isinstance(message, bytes):
        return message
    return message.SerializeToString()
