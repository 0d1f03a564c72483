"""Semantic validation: checks that need the conversation, on new items only.

Field-level checks happen when the request is parsed. This stage checks what only the
conversation can tell: that a ``function_call_output`` answers a call the model actually
made, once, and that a ``function_call`` in the input names a declared function. The core
carries the known and answered call ids between turns, so the history is never walked again.
"""

from __future__ import annotations

from ..core.ports import ApiError, CarriedState, Flag, StageInput, shown
from .base import register_stage


class ValidationStage:
    """Call-id and tool-name checks against the conversation's call ids."""

    name = "validation"

    async def examine(self, batch: StageInput, carried: CarriedState) -> list[Flag]:
        """Raise ApiError for an output without a call, or a call of an undeclared function."""
        new_calls: set[str] = set()
        new_answers: set[str] = set()
        declared = batch.declared_functions
        for item, path in zip(batch.items, batch.paths, strict=True):
            if item["type"] == "function_call" or item["type"] == "custom_tool_call":
                if item["type"] == "function_call" and declared and item["name"] not in declared:
                    raise ApiError(
                        f"Invalid '{path}.name': no function named '{shown(item['name'])}' is "
                        "declared in 'tools'.",
                        code="invalid_value",
                        param=f"{path}.name",
                    )
                new_calls.add(item["call_id"])
            elif (
                item["type"] == "function_call_output" or item["type"] == "custom_tool_call_output"
            ):
                call_id = item.get("call_id", "")
                if call_id not in batch.known_calls and call_id not in new_calls:
                    raise ApiError(
                        f"Invalid '{path}.call_id': no tool call found for function call output "
                        f"with call_id '{shown(call_id)}'.",
                        code="invalid_value",
                        param=f"{path}.call_id",
                    )
                if call_id in batch.answered_calls or call_id in new_answers:
                    raise ApiError(
                        f"Invalid '{path}.call_id': duplicate output for call_id "
                        f"'{shown(call_id)}', which was already answered.",
                        code="invalid_value",
                        param=f"{path}.call_id",
                    )
                new_answers.add(call_id)
        return []


register_stage("validation", ValidationStage)
