"""A run's link to the stream that started it: how it emits on its lane, and what it reports
(``runs.runner.RunHooks``), told to the lane machine under its ticket's number."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, cast

from bidi_responses.schema import FunctionCallItem, Item, ServerEvent

from ..runs.runner import output_stubs
from .actions import Action, RunEnd, RunStatus
from .lane_create import LaneCreate
from .lifecycle import LaneMachine

if TYPE_CHECKING:
    from ..runs.runner import ResponseRun


class Stream(Protocol):
    """What a run's link uses of its stream (``session.Session``)."""

    @property
    def machine(self) -> LaneMachine[LaneCreate]: ...

    async def emit(self, lane: str, data: ServerEvent) -> None: ...

    def hold(self, lane: str) -> None: ...

    async def apply(
        self, actions: list[Action[LaneCreate]], answers: Mapping[str, object] | None = None
    ) -> None: ...


class RunLink:
    """One run's emit (``runs.output_items.Emit``) and hooks, bound to its lane and ticket."""

    __slots__ = ("_lane", "_number", "_session")

    def __init__(self, session: Stream, lane: str, number: int) -> None:
        self._session = session
        self._lane = lane
        self._number = number

    # -- emit ------------------------------------------------------------------------------

    async def __call__(self, data: ServerEvent) -> None:
        await self._session.emit(self._lane, data)

    def hold(self) -> None:
        """More of the step follows at once (streaming.py calls it when an engine segment
        finished): a batching writer waits for it (``Outbox.hold``)."""
        self._session.hold(self._lane)

    # -- hooks -----------------------------------------------------------------------------

    def created(self, run: ResponseRun) -> None:
        self._session.machine.created(self._number, run.id)

    def ending(self, run: ResponseRun) -> None:
        # Its terminal event goes out next: from now on a steer finds it finished, and what
        # follows it (a successor, steer.pending) is sent once the run's task is done.
        self._session.machine.ending(self._number, end_of(run))

    async def waiting(self, run: ResponseRun, calls: list[FunctionCallItem]) -> None:
        stubs = output_stubs(calls)
        await self._session.apply(self._session.machine.waiting(run.id, stubs))

    def resumed(self, run: ResponseRun) -> list[Item]:
        steers = self._session.machine.resumed(run.id)
        return [cast(Item, item) for steer in steers for item in steer.items]


def end_of(run: ResponseRun) -> RunEnd:
    """How ``run`` ended, as the lane machine counts it."""
    return RunEnd(
        _status_of(run),
        run.required_input,
        # A parent that is gone (neither cached nor stored) can take no continuation any more.
        parent_lost=run.refusal == "previous_response_not_found",
    )


def _status_of(run: ResponseRun) -> RunStatus:
    record = run.record
    if not run.created_sent or record is None:
        return "refused"
    status = record.status
    if status == "completed" or status == "incomplete" or status == "failed":
        return status
    return "cancelled"  # by the client, or cut short with its stream
