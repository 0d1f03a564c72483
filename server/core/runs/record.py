"""Response objects and streaming events, built once as JSON-shaped dicts.

Every transport serializes these same dicts: WebSocket and SSE write them as JSON, gRPC maps
them by field name onto ``bidi_responses.v1`` messages. Nothing about the wire lives here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from bidi_responses.schema import (
    ErrorEvent,
    ErrorObject,
    Item,
    Outcome,
    ResponseError,
    ResponseObject,
    ResponseStatus,
    SafetyFlagObject,
    ServerEvent,
    TerminalEvent,
    UsageObject,
)

from ..api.requests import CreateRequest
from ..observability.stats import ResponseStats

TERMINAL_TYPES = frozenset({"response.completed", "response.failed", "response.incomplete"})


@dataclass(slots=True)
class OutEvent:
    """A server event for one lane of a stream (``lane`` is the ``stream_id``; "" by default)."""

    lane: str
    data: ServerEvent


@dataclass(slots=True)
class Usage:
    """Token usage of one response (real o200k tokens)."""

    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0

    def to_dict(self) -> UsageObject:
        """The Responses ``usage`` object."""
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.input_tokens + self.output_tokens,
        }


@dataclass(slots=True)
class ResponseRecord:
    """A response as it evolves; ``snapshot()`` gives the complete Responses object."""

    id: str
    request: CreateRequest
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: ResponseStatus = "in_progress"
    output: list[Item] = field(default_factory=list)
    usage: Usage | None = None
    error: ResponseError | None = None
    incomplete_reason: str | None = None
    completed_at: int | None = None
    safety_flags: list[SafetyFlagObject] = field(default_factory=list)
    stats: ResponseStats = field(default_factory=ResponseStats)

    def snapshot(self) -> ResponseObject:
        """All 31 Responses fields (nullable ones as None) plus the server's extensions."""
        req = self.request
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": self.completed_at,
            "status": self.status,
            "incomplete_details": (
                {"reason": self.incomplete_reason} if self.incomplete_reason else None
            ),
            "model": req.model,
            "previous_response_id": req.previous_response_id,
            "instructions": req.instructions,
            "output": list(self.output),
            "error": self.error,
            "tools": req.tools,
            "tool_choice": req.tool_choice,
            "truncation": req.truncation,
            "parallel_tool_calls": req.parallel_tool_calls,
            "text": req.text,
            "top_p": req.top_p,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "temperature": req.temperature,
            "top_logprobs": 0,
            "reasoning": req.reasoning,
            "usage": self.usage.to_dict() if self.usage else None,
            "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": req.max_tool_calls,
            "store": req.store,
            "background": req.background,
            "service_tier": "default",
            "safety_identifier": req.safety_identifier,
            "prompt_cache_key": req.prompt_cache_key,
            "metadata": req.metadata,
            "user": req.user,
            "safety_flags": list(self.safety_flags),
            "stats": self.stats.to_dict(),
        }


class EventSequence:
    """Numbers a response's events from 0, in the order they are sent."""

    __slots__ = ("next",)

    def __init__(self) -> None:
        self.next = 0

    def take(self) -> int:
        """The next event's sequence number."""
        number = self.next
        self.next += 1
        return number


def terminal_event(outcome: Outcome, response: ResponseObject, number: int) -> TerminalEvent:
    """The event that ends a response as ``outcome``, numbered ``number``."""
    if outcome == "completed":
        return {"type": "response.completed", "response": response, "sequence_number": number}
    if outcome == "incomplete":
        return {"type": "response.incomplete", "response": response, "sequence_number": number}
    return {"type": "response.failed", "response": response, "sequence_number": number}


#: What an error event may say it answers, in this order.
_ANSWER_KEYS: tuple[Literal["request_type", "event_id", "response_id"], ...] = (
    "request_type",
    "event_id",
    "response_id",
)


def error_event(
    status: int, error: ErrorObject, answers: Mapping[str, object] | None = None
) -> ErrorEvent:
    """The nested error event of WebSocket mode (also used on Connect).

    ``answers`` says which request the error answers: ``request_type``, the client's
    ``event_id`` and the ``response_id`` concerned; unknown ones are left out.
    """
    if answers:
        error = error.copy()
        for key in _ANSWER_KEYS:
            value = answers.get(key)
            if isinstance(value, str) and value:
                error[key] = value
    return {"type": "error", "status": status, "error": error}


def answers_to(event: object) -> dict[str, object]:
    """What an error about client ``event`` should say it answers."""
    if not isinstance(event, dict):
        return {}
    kind = event.get("type")
    response_id = event.get("response_id")
    if kind == "response.create":
        response_id = event.get("previous_response_id")
    return {"request_type": kind, "event_id": event.get("event_id"), "response_id": response_id}
