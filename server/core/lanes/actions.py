"""What the lane machine (``lifecycle.LaneMachine``) and its driver (``session.Session``) say to
each other: the machine's bounds, the creates it tracks (``Ticket``), how a run ended
(``RunEnd``), and the actions it answers with for the driver to carry out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Literal, Protocol, Self, TypeAlias, TypeVar

from bidi_responses.schema import JSONObject, JSONValue, RequiredInputStub, ServerEvent

from ..api.errors import ApiError


@dataclass(frozen=True, slots=True)
class LaneLimits:
    """The stream's lane bounds (hosted values by default)."""

    max_active: int = 16
    max_queued: int = 256
    max_named_lanes: int = 32
    max_pending_steers: int = 16
    # The error code past ``max_named_lanes`` (each transport names it: ``StreamNaming``).
    lane_limit_code: str = "stream_limit_reached"


class LaneRequest(Protocol):
    """What the machine needs of a create's typed request."""

    @property
    def previous_response_id(self) -> str | None: ...

    def successor(self, response_id: str, steering: list[JSONObject]) -> Self:
        """The automatic successor of ``response_id`` (which ran this request): the same
        settings, continuing it with ``steering`` as its input."""
        ...


Request = TypeVar("Request", bound=LaneRequest)


@dataclass(slots=True)
class Steer:
    """An accepted steering submission, owned by the server until committed or failed."""

    id: str
    target: str
    input: JSONValue
    items: tuple[JSONObject, ...]
    # ``response.steer.pending`` was sent (at most once per steer).
    announced: bool = False


@dataclass(slots=True)
class Ticket(Generic[Request]):
    """One create on its way through a lane, from arrival to its end."""

    number: int
    lane: str
    request: Request
    # The response an automatic successor continues (its request's input: the steers').
    successor_of: str | None = None
    # Steering input this create commits at its ``response.created``, in submission order.
    steers: list[Steer] = field(default_factory=list)
    response_id: str | None = None
    waiting: bool = False
    # Its start is held back until the run before it on the lane is done (``LaneMachine.done``).
    held: bool = False

    @property
    def previous_response_id(self) -> str | None:
        return self.request.previous_response_id


#: How a run ended: ``refused`` = an error event before its ``response.created``;
#: ``cancelled`` = cancelled by the client, or its stream went away.
RunStatus: TypeAlias = Literal["refused", "completed", "incomplete", "failed", "cancelled"]


@dataclass(frozen=True, slots=True)
class RunEnd:
    """How a run ended, as the machine counts it: ``required`` = the client tool calls it
    ended with; ``parent_lost`` = it was refused because its ``previous_response_id`` is gone."""

    status: RunStatus
    required: list[RequiredInputStub] = field(default_factory=list)
    parent_lost: bool = False


@dataclass(frozen=True, slots=True)
class Start(Generic[Request]):
    """Run ``ticket`` now (its input: the steers' items, then its own)."""

    ticket: Ticket[Request]


@dataclass(frozen=True, slots=True)
class Emit:
    """Send ``event`` on ``lane``."""

    lane: str
    event: ServerEvent


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer the client event being handled with an ``error`` event on ``lane``."""

    lane: str
    error: ApiError


@dataclass(frozen=True, slots=True)
class StopAtBoundary:
    """Stop run ``number`` once its current output item is done."""

    number: int


@dataclass(frozen=True, slots=True)
class Offer:
    """Hand tool outputs to run ``number`` on ``lane`` (the run checks them; an ApiError
    answers the event). ``inject``: acknowledge them with ``LaneMachine.injected`` once taken."""

    number: int
    lane: str
    response_id: str
    input: JSONValue
    inject: bool = False


@dataclass(frozen=True, slots=True)
class CancelRun:
    """Cancel run ``number`` (``reason``: its incomplete reason); ``if_waiting``: only if it
    waits for tool outputs, which it can get no more."""

    number: int
    reason: str = "cancelled"
    if_waiting: bool = False


Action: TypeAlias = Start[Request] | Emit | Refuse | StopAtBoundary | Offer | CancelRun
