"""What the orchestrator and a client worker send each other over the pipe.

A command goes down (``AgentsCommand``, ``KeepupCommand`` or ``SteerCommand``);
``("progress", 1)`` per turn and then ``("result", ...)`` (``AgentsResult``, ``KeepupResult``
or ``SteerResult``) or ``("error", text)`` come back. Both ends are typed against these
shapes; the pipe itself pickles plain dicts.
"""

from __future__ import annotations

from typing import Literal, Required, TypedDict

from ..jsontypes import JSONObject
from .exchange import ServerAddress

__all__ = [
    "AgentsCommand",
    "AgentsResult",
    "Command",
    "KeepupCommand",
    "KeepupResponse",
    "KeepupResult",
    "RolloutResult",
    "SteerCommand",
    "SteerResult",
    "SteerRound",
]


class AgentsCommand(TypedDict, total=False):
    """Run ``agents`` rollouts of one mode at once (a cell fills it in step by step)."""

    cmd: Required[Literal["agents"]]
    server: Required[ServerAddress]
    mode: str
    agents: int
    #: Take turns' bytes from the sockets (one agent per process only).
    bytes: bool
    model: str
    store_all: bool
    instructions: str
    tools: list[JSONObject]
    tool_choice: JSONObject
    #: The first user message's text, after a per-rollout nonce (when no ``first_input``).
    user_text: str
    #: The first turn's input items instead (the history sweep's prefilled conversation).
    first_input: list[JSONObject]
    #: Tool outputs, in turn order, repeated when the model calls more tools.
    tool_outputs: list[str]
    tool_ms: float
    max_tool_turns: int
    setup_turns: int
    repeat: int
    nonce: str
    #: Added to each agent's index in the turn records (several processes per mode).
    agent_base: int
    #: The agents share one connection (a Connect stream, a WebSocket), each on its own lane.
    lanes: bool


class KeepupCommand(TypedDict):
    """``responses`` long text answers on one connection, chained."""

    cmd: Literal["keepup"]
    server: ServerAddress
    mode: str
    responses: int


class SteerCommand(TypedDict):
    """``rounds`` steered responses on one connection: each is steered at its
    ``response.created`` and followed to its automatic successor's end."""

    cmd: Literal["steer"]
    server: ServerAddress
    mode: str
    rounds: int


Command = AgentsCommand | KeepupCommand | SteerCommand


class RolloutResult(TypedDict):
    """One rollout's span and outcome."""

    agent: int
    t_start: float
    t_end: float
    e2e_s: float
    turns: int
    status: str


class AgentsResult(TypedDict):
    """Every turn (``TurnRecord`` as a dict) and rollout of an agents command."""

    turns: list[JSONObject]
    rollouts: list[RolloutResult]
    t_start: float
    t_end: float
    client_cpu_s: float


class KeepupResponse(TypedDict):
    """One keep-up answer as the client saw it (perf_counter timestamps)."""

    output_tokens: int
    t_send: float
    t_first_delta: float | None
    t_last_delta: float | None
    t_end: float
    deltas: int
    events: int
    engine_ms: float


class SteerRound(TypedDict):
    """One steered response as the client saw it (perf_counter timestamps)."""

    #: The steer was written.
    t_steer: float
    #: Its acknowledgement arrived (accepted or failed).
    t_ack: float
    #: The successor's first output_text delta arrived (None: no successor).
    t_successor_first_token: float | None
    accepted: bool
    #: How the steered response ended: "incomplete" (steered) or "completed".
    target_status: str
    target_reason: str | None
    successor_status: str | None


class SteerResult(TypedDict):
    """Every round of a steer command and the command's span."""

    rounds: list[SteerRound]
    t_start: float
    t_end: float


class KeepupResult(TypedDict):
    """Every answer of a keep-up command and the command's span."""

    responses: list[KeepupResponse]
    t_start: float
    t_end: float
