"""The agent-loop helper: call tools, feed their outputs back, repeat until the model answers.

Two shapes, the same tools:

* ``mode="chain"`` (released design): every turn is a ``response.create`` carrying only the
  new tool outputs and ``previous_response_id``; the server's stream cache has the rest.
* ``mode="append"`` (prototype): one long-running response; each ``response.done`` is
  answered with ``response.append``.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from bidi_responses.schema import FunctionCallItem, FunctionCallOutputItem

from .stream import ConnectStream
from .types import JSONObject, JSONValue, Response, ResponseInput

ToolFunction = Callable[[JSONObject], "str | Awaitable[str]"]


@dataclass(slots=True)
class AgentResult:
    """The final response and every turn on the way (one per create or append)."""

    final: Response
    turns: list[Response] = field(default_factory=list)

    @property
    def tool_calls(self) -> int:
        """How many tool calls were executed."""
        return sum(len(turn.function_calls) for turn in self.turns[:-1])


async def _call_tool(functions: Mapping[str, ToolFunction], call: FunctionCallItem) -> str:
    function = functions.get(call["name"])
    if function is None:
        return json.dumps({"error": f"unknown tool {call['name']}"})
    try:
        arguments = json.loads(call["arguments"] or "{}")
    except json.JSONDecodeError as error:
        return json.dumps({"error": f"arguments are not JSON: {error}"})
    result = function(arguments)
    if inspect.isawaitable(result):
        result = await result
    return str(result)


async def run_tools(
    functions: Mapping[str, ToolFunction], calls: Sequence[FunctionCallItem]
) -> list[FunctionCallOutputItem]:
    """Run each call's function; return the ``function_call_output`` items."""
    return [
        {
            "type": "function_call_output",
            "call_id": call["call_id"],
            "output": await _call_tool(functions, call),
        }
        for call in calls
    ]


async def run_agent_loop(
    stream: ConnectStream,
    *,
    model: str,
    input: ResponseInput,
    tools: Sequence[JSONObject],
    functions: Mapping[str, ToolFunction],
    mode: Literal["chain", "append"] = "chain",
    max_turns: int = 100,
    stream_id: str = "",
    **params: JSONValue,
) -> AgentResult:
    """Run an agent until it answers without tool calls (or ``max_turns`` is reached)."""
    tools = list(tools)
    if mode == "append":
        response = await stream.create(
            model=model, input=input, tools=tools, append_mode=True, stream_id=stream_id, **params
        )
        result = AgentResult(final=response, turns=[response])
        while response.pending_calls and len(result.turns) < max_turns:
            outputs = await run_tools(functions, response.pending_calls)
            response = await stream.append(response.id, outputs, stream_id=stream_id)
            result.turns.append(response)
        result.final = response
        return result
    response = await stream.create(
        model=model, input=input, tools=tools, stream_id=stream_id, **params
    )
    result = AgentResult(final=response, turns=[response])
    while response.function_calls and len(result.turns) < max_turns:
        outputs = await run_tools(functions, response.function_calls)
        response = await stream.create(
            model=model,
            input=outputs,
            tools=tools,
            previous_response_id=response.id,
            stream_id=stream_id,
            **params,
        )
        result.turns.append(response)
    result.final = response
    return result
