"""The words of a stream's control events: what the lane machine answers to a steer or an
inject (``response.steer.accepted/pending/failed``, ``response.inject.created/failed``).

Each builder takes the event's ``sequence_number`` from the machine's own counter; a failed
steer echoes its input back (bounded by ``ECHO_MAX_CHARS``) so the client can resend it.
"""

from __future__ import annotations

from bidi_responses.schema import (
    FailedSteer,
    JSONValue,
    RequiredInputStub,
    ResponseInjectCreatedEvent,
    ResponseInjectFailedEvent,
    ResponseSteerAcceptedEvent,
    ResponseSteerFailedEvent,
    ResponseSteerPendingEvent,
)

#: The most characters of a failed steer's input echoed back in ``response.steer.failed``.
#: The echo lets a client resend the input elsewhere; a larger one costs the writer seconds of
#: encoding on the event loop and is refused by stock gRPC clients (4 MiB per message), which
#: would end the whole stream over one refused steer. The client has the input it sent.
ECHO_MAX_CHARS = 1_048_576


def steer_accepted(steer_id: str, target: str, seq: int) -> ResponseSteerAcceptedEvent:
    return {
        "type": "response.steer.accepted",
        "steer": {"id": steer_id, "previous_response_id": target},
        "sequence_number": seq,
    }


def steer_pending(
    steer_id: str, target: str, required: list[RequiredInputStub], seq: int
) -> ResponseSteerPendingEvent:
    return {
        "type": "response.steer.pending",
        "steer": {"id": steer_id, "previous_response_id": target},
        "reason": "waiting_for_required_input",
        "required_input": list(required),
        "sequence_number": seq,
    }


def steer_failed(
    target: str, raw_input: JSONValue, code: str, message: str, steer_id: str | None, seq: int
) -> ResponseSteerFailedEvent:
    """``steer_id`` is None for a steer refused before it got one (bad input, unknown target)."""
    steer: FailedSteer = {"previous_response_id": target, "input": _echoed(raw_input)}
    if steer_id is not None:
        steer["id"] = steer_id
    return {
        "type": "response.steer.failed",
        "steer": steer,
        "error": {"code": code, "message": message, "type": "invalid_request_error"},
        "sequence_number": seq,
    }


def inject_created(response_id: str, seq: int) -> ResponseInjectCreatedEvent:
    return {"type": "response.inject.created", "response_id": response_id, "sequence_number": seq}


def inject_failed(
    response_id: str, raw_input: JSONValue, known: bool, seq: int
) -> ResponseInjectFailedEvent:
    """``known``: the response ran on this stream (it is not waiting any more)."""
    return {
        "type": "response.inject.failed",
        "response_id": response_id,
        "input": list(raw_input) if isinstance(raw_input, list) else [],
        "error": {
            "code": "response_already_completed" if known else "response_not_found",
            "message": f"Response '{response_id}' is not waiting for tool outputs."
            if known
            else f"No response '{response_id}' is active on this connection.",
        },
        "sequence_number": seq,
    }


def _echoed(raw_input: JSONValue) -> JSONValue:
    """``raw_input`` as echoed in ``response.steer.failed``: as sent, or, past
    ``ECHO_MAX_CHARS``, empty of its kind (``""`` for a string, ``[]`` otherwise)."""
    if _chars_within(raw_input, ECHO_MAX_CHARS) is not None:
        return raw_input
    return "" if isinstance(raw_input, str) else []


def _chars_within(value: JSONValue, budget: int) -> int | None:
    """What is left of ``budget`` after the characters of ``value``'s strings and keys (and
    one for every other value); None once it is spent. Iterative, and it stops where the
    budget runs out, so any depth or size of input costs at most ``budget`` steps."""
    stack: list[JSONValue] = [value]
    while stack:
        top = stack.pop()
        if isinstance(top, str):
            budget -= len(top)
        elif isinstance(top, dict):
            budget -= 1 + sum(len(key) for key in top)
            stack.extend(top.values())
        elif isinstance(top, list):
            budget -= 1
            stack.extend(top)
        else:
            budget -= 1
        if budget < 0:
            return None
    return budget
