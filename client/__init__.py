"""The Python client of bidi-responses.

* ``AsyncResponsesClient`` / ``ConnectStream``: async, over gRPC.
* ``ResponsesClient``: the blocking wrapper.
* ``run_agent_loop``: runs tools and continues with ``previous_response_id`` or append mode.
* ``Conversation``: a chain of turns that survives replica drains and deaths behind a proxy.
* ``Response`` and its typed items (``Item``, ``FunctionCallItem``, ...): the API's types, the
  server's own (``bidi_responses.schema``).
"""

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

from .agent import AgentResult, run_agent_loop, run_tools
from .aio import AsyncResponsesClient
from .failover import Conversation, run_resilient_agent
from .stream import ConnectStream, StreamLane
from .sync import ResponsesClient, SyncConnectStream
from .types import NoSuccessor, Response, ResponsesError, SteerAck, Usage

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
