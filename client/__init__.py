"""The Python client of bidi-responses.

* ``AsyncResponsesClient`` / ``ConnectStream``: async, over gRPC.
* ``ResponsesClient``: the blocking wrapper.
* ``run_agent_loop``: runs tools and continues with ``previous_response_id`` or append mode.
* ``Conversation``: a chain of turns that survives replica drains and deaths behind a proxy.
* ``Response`` and its typed items (``Item``, ``FunctionCallItem``, ...): the API's types, the
  server's own (``bidi_responses.schema``).
"""

from bidi_responses.client.agent import AgentResult, run_agent_loop, run_tools
from bidi_responses.client.aio import AsyncResponsesClient
from bidi_responses.client.failover import Conversation, run_resilient_agent
from bidi_responses.client.stream import ConnectStream, StreamLane
from bidi_responses.client.sync import ResponsesClient, SyncConnectStream
from bidi_responses.client.types import NoSuccessor, Response, ResponsesError, SteerAck, Usage
from bidi_responses.schema import (
    ContentPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    Item,
    MessageItem,
    OutputTextPart,
    ReasoningItem,
    ResponseObject,
)

__all__ = [
    "AgentResult",
    "AsyncResponsesClient",
    "ConnectStream",
    "ContentPart",
    "Conversation",
    "FunctionCallItem",
    "FunctionCallOutputItem",
    "Item",
    "MessageItem",
    "NoSuccessor",
    "OutputTextPart",
    "ReasoningItem",
    "Response",
    "ResponseObject",
    "ResponsesClient",
    "ResponsesError",
    "SteerAck",
    "StreamLane",
    "SyncConnectStream",
    "Usage",
    "run_agent_loop",
    "run_resilient_agent",
    "run_tools",
]
