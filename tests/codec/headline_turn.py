"""A headline turn's server events, shaped as the core emits them, for the codec's tests and
benchmarks: the snapshots echo the benchmark rollout's instructions and 8 tools (a checked
``ToolList``, as the core hands them to the encoder), the model writes a short message and
then calls a tool, and the terminal snapshot carries usage and stats."""

from __future__ import annotations

from bidi_responses.bench.workload import WorkloadSpec, build_workload
from bidi_responses.codec import JSONObject
from bidi_responses.server.core.api.tools import ToolList

WORKLOAD = build_workload(WorkloadSpec(tool_turns=1, tool_output_tokens=50, user_tokens=50))
#: The rollout's tools as the core echoes them (optional fields present, null when unset).
ECHOED_TOOLS = ToolList({"description": None, "strict": None, **tool} for tool in WORKLOAD.tools)
TEXT_DELTAS = ["I", " will", " read", " the", " file", " first", "."]
ARGUMENTS = '{"path":"server/core/lanes/lane.py","start_line":14,"end_line":120}'
ARGUMENT_DELTAS = [ARGUMENTS[i : i + 12] for i in range(0, len(ARGUMENTS), 12)]


def _stats(final: bool) -> JSONObject:
    return {
        "items_validated": 1,
        "tokens_rendered": 2081 if final else 2028,
        "tokens_reused": 1988,
        "prefill_tokens": 40,
        "engine_ms": 41.7 if final else 0.0,
        "api_pre_ms": 2.318,
        "api_post_ms": 0.188 if final else 0.0,
        "route_resolved": True,
        "stage_items": {"validation": 1, "secrets": 1, "injection": 1},
        "stage_ms": {"validation": 0.008, "secrets": 0.096, "injection": 0.004},
        "pre_inference_runs": 1,
        "engine_runs": 1 if final else 0,
        "engine_prompt_tokens": 2028 if final else 0,
        "engine_cached_tokens": 1988 if final else 0,
    }


def response(status: str, output: list[JSONObject], *, final: bool = False) -> JSONObject:
    """The Response object of a snapshot."""
    return {
        "id": "resp_5d06a54d77d53e52fdc2552e6387d7a3",
        "object": "response",
        "created_at": 1_796_157_361,
        "completed_at": 1_796_157_362 if final else None,
        "status": status,
        "incomplete_details": None,
        "model": "sim-model",
        "previous_response_id": "resp_41f1d3b4175b2647e00ffadaa196b401",
        "instructions": WORKLOAD.instructions,
        "output": output,
        "error": None,
        "tools": ECHOED_TOOLS,
        "tool_choice": "auto",
        "truncation": "disabled",
        "parallel_tool_calls": True,
        "text": {"format": {"type": "text"}},
        "top_p": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "temperature": 1.0,
        "top_logprobs": 0,
        "reasoning": None,
        "usage": (
            {
                "input_tokens": 2081,
                "input_tokens_details": {"cached_tokens": 1988},
                "output_tokens": 47,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 2128,
            }
            if final
            else None
        ),
        "max_output_tokens": None,
        "max_tool_calls": None,
        "store": False,
        "background": False,
        "service_tier": "default",
        "safety_identifier": None,
        "prompt_cache_key": None,
        "metadata": {},
        "user": None,
        "safety_flags": [],
        "stats": _stats(final),
    }


def headline_turn() -> list[JSONObject]:
    """The events of one turn, numbered from 0."""
    message_id, call_id = "msg_0a1b2c3d4e5f60718293a4b5c6d7e8f9", "fc_41f1d3b4175b2647e00ffadaa1"
    text = "".join(TEXT_DELTAS)
    part: JSONObject = {"type": "output_text", "text": text, "annotations": []}
    message: JSONObject = {
        "type": "message",
        "id": message_id,
        "role": "assistant",
        "status": "completed",
        "content": [part],
    }
    call: JSONObject = {
        "type": "function_call",
        "id": call_id,
        "call_id": "call_af4385b7e5329bfdf6cf78510bf5de4c",
        "name": "read_file",
        "arguments": ARGUMENTS,
        "status": "completed",
    }
    text_at: JSONObject = {"item_id": message_id, "output_index": 0, "content_index": 0}
    events: list[JSONObject] = [
        {"type": "response.created", "response": response("in_progress", [])},
        {"type": "response.in_progress", "response": response("in_progress", [])},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**message, "status": "in_progress", "content": []},
        },
        {
            "type": "response.content_part.added",
            **text_at,
            "part": {"type": "output_text", "text": "", "annotations": []},
        },
        *({"type": "response.output_text.delta", **text_at, "delta": d} for d in TEXT_DELTAS),
        {"type": "response.output_text.done", **text_at, "text": text},
        {"type": "response.content_part.done", **text_at, "part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": message},
        {
            "type": "response.output_item.added",
            "output_index": 1,
            "item": {**call, "arguments": "", "status": "in_progress"},
        },
        *(
            {
                "type": "response.function_call_arguments.delta",
                "item_id": call_id,
                "output_index": 1,
                "delta": d,
            }
            for d in ARGUMENT_DELTAS
        ),
        {
            "type": "response.function_call_arguments.done",
            "item_id": call_id,
            "output_index": 1,
            "arguments": ARGUMENTS,
            "name": "read_file",
        },
        {"type": "response.output_item.done", "output_index": 1, "item": call},
        {
            "type": "response.completed",
            "response": response("completed", [message, call], final=True),
        },
    ]
    return [{**e, "sequence_number": n} for n, e in enumerate(events)]


def create_body() -> JSONObject:
    """The create that follows the turn: the same instructions and tools, the tool's output."""
    return {
        "model": "sim-model",
        "instructions": WORKLOAD.instructions,
        "tools": WORKLOAD.tools,
        "previous_response_id": "resp_5d06a54d77d53e52fdc2552e6387d7a3",
        "input": [
            {
                "type": "function_call_output",
                "call_id": "call_af4385b7e5329bfdf6cf78510bf5de4c",
                "output": WORKLOAD.tool_output(0),
            }
        ],
        "store": False,
    }
