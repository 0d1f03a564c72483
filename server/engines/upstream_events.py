"""Upstream Responses events translated into engine events, one event at a time.

``translate`` turns an upstream's streamed event (``response.output_item.added``, the text,
refusal and argument deltas, ``response.output_item.done``, the terminal events, ``error``)
into the ``ItemStart`` / ``Delta`` / ``ItemEnd`` the core expects, recording what it saw in the
turn's ``UpstreamTurn``; ``finish`` reads the terminal response's usage into the
``EngineFinish``. Items the engine does not relay (hosted tool calls) are skipped whole.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

from bidi_responses.schema import JSONObject

from ..core.ports import (
    Delta,
    EngineError,
    EngineEvent,
    EngineFinish,
    ItemEnd,
    ItemStart,
)
from .http_backend import RetryableError, decode_object

__all__ = ["UpstreamTurn", "finish", "translate", "translate_raw"]

_TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete"})


@dataclass(slots=True)
class UpstreamTurn:
    """One attempt's progress: what was streamed and the terminal response."""

    started: float
    events: int = 0
    items: int = 0
    calls: int = 0
    kind: str | None = None
    # Whether the current item had deltas (some upstreams send only the finished item).
    had_delta: bool = False
    streamed: bool = False
    response: JSONObject = field(default_factory=dict)
    terminal: str = ""


def translate_raw(raw: str | bytes, turn: UpstreamTurn) -> list[EngineEvent]:
    """One upstream event as it arrived (JSON text) as engine events."""
    return translate(decode_object(raw, "The upstream sent an event"), turn)


def translate(event: JSONObject, turn: UpstreamTurn) -> list[EngineEvent]:
    """One upstream event as engine events; records the terminal response in ``turn``."""
    kind = event.get("type")
    turn.events += 1
    if kind == "error":
        nested = event.get("error")
        error: JSONObject = nested if isinstance(nested, dict) else event
        code = str(error.get("code") or "")
        message = f"The upstream answered an error: {error.get('message') or code}"
        if code == "previous_response_not_found" and not turn.streamed:
            raise RetryableError("engine_error", message, fresh=True)
        raise EngineError("engine_error", message)
    if kind in _TERMINAL:
        response = event.get("response")
        if not isinstance(response, dict):
            raise EngineError("engine_bad_response", f"The upstream's {kind} has no response.")
        if kind == "response.failed":
            error = response.get("error") or {}
            raise EngineError(
                "engine_error",
                f"The upstream response failed: {error.get('message') or error}",
            )
        turn.response = response
        turn.terminal = str(kind)
        return []
    if kind == "response.output_item.added":
        item = event.get("item") or {}
        item_kind = item.get("type")
        turn.streamed = True
        turn.had_delta = False
        if item_kind == "function_call":
            turn.kind = "function_call"
            return [
                ItemStart(
                    "function_call",
                    name=str(item.get("name", "")),
                    call_id=str(item.get("call_id", "")),
                )
            ]
        if item_kind == "message":
            turn.kind = "message"
            return [ItemStart("message")]
        if item_kind == "reasoning":
            turn.kind = "reasoning"
            return [ItemStart("reasoning")]
        turn.kind = None  # an item this engine does not relay (a hosted tool call)
        return []
    if kind in (
        "response.output_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
    ):
        delta = event.get("delta")
        if turn.kind in ("message", "function_call") and isinstance(delta, str) and delta:
            turn.had_delta = True
            return [Delta(delta, ())]
        return []
    if kind == "response.output_item.done":
        if turn.kind is None:
            return []
        item = event.get("item") or {}
        out: list[EngineEvent] = []
        if turn.kind == "reasoning":
            parts = item.get("summary") or item.get("content") or ()
            text = "\n".join(str(part.get("text", "")) for part in parts if isinstance(part, dict))
            if text:
                out.append(Delta(text, ()))
        if not turn.had_delta and turn.kind == "function_call" and item.get("arguments"):
            out.append(Delta(str(item["arguments"]), ()))
        if not turn.had_delta and turn.kind == "message":
            text = "".join(
                str(part.get("text") or part.get("refusal") or "")
                for part in item.get("content") or ()
                if isinstance(part, dict)
            )
            if text:
                out.append(Delta(text, ()))
        if turn.kind == "function_call":
            turn.calls += 1
        turn.items += 1
        turn.kind = None
        out.append(ItemEnd())
        return out
    return []


def finish(turn: UpstreamTurn) -> EngineFinish:
    """The segment's ``EngineFinish``, from the upstream's terminal response."""
    response = turn.response
    usage = response.get("usage") or {}
    details = usage.get("input_tokens_details") or {}
    stats = response.get("stats") or {}
    wall = time.perf_counter() - turn.started
    engine_ms = stats.get("engine_ms")
    reason: Literal["stop", "tool_calls", "max_output_tokens"] = "stop"
    incomplete = response.get("incomplete_details") or {}
    if turn.terminal == "response.incomplete" and incomplete.get("reason") in (
        "max_output_tokens",
        "max_tokens",
    ):
        reason = "max_output_tokens"
    elif turn.calls:
        reason = "tool_calls"
    prompt = int(usage.get("input_tokens") or 0)
    cached = int(details.get("cached_tokens") or 0)
    return EngineFinish(
        reason=reason,
        output_tokens=int(usage.get("output_tokens") or 0),
        prefill_tokens=max(prompt - cached, 0),
        engine_seconds=float(engine_ms) / 1000 if isinstance(engine_ms, int | float) else wall,
        extra={"upstream_response_id": response.get("id")},
        prompt_tokens=prompt,
        cached_tokens=cached,
    )
