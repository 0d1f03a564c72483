"""The steers of one stream, for the lane machine: those pending per running response, what a
waiting append-mode response needs, the responses that ended (so a late steer is told why),
and the answers (``response.steer.*``) with the stream's control-event sequence numbers.

Sans-I/O like the machine that owns it (``lifecycle.LaneMachine``), which decides where the
steers go when their target ends.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from bidi_responses.schema import JSONObject, JSONValue, RequiredInputStub

from .actions import Emit, LaneLimits, Steer
from .control_events import steer_accepted, steer_failed, steer_pending

# Responses that ended on a stream, remembered so that a steer for one gets
# ``response_already_completed`` rather than ``response_not_found``.
_ENDED_REMEMBERED = 4096


class SteerBook:
    """Accepted steers until their target ends, and the answers to every steer."""

    def __init__(self, limits: LaneLimits, new_steer_id: Callable[[], str]) -> None:
        self.limits = limits
        self._new_steer_id = new_steer_id
        # Pending steers by running response id (after its response.created).
        self._pending: dict[str, list[Steer]] = {}
        # What a waiting append-mode response needs from the client.
        self._stubs: dict[str, list[RequiredInputStub]] = {}
        # Ended responses: id -> (lane, completed or incomplete), for steer answers.
        self._ended: OrderedDict[str, tuple[str, bool]] = OrderedDict()
        self._seq = 0

    def next_seq(self) -> int:
        """The next ``sequence_number`` of the stream's control events (steer, inject)."""
        self._seq += 1
        return self._seq

    def pending(self) -> list[Steer]:
        """Every steer pending for a running response."""
        return [steer for pending in self._pending.values() for steer in pending]

    def has_pending(self, response_id: str) -> bool:
        return bool(self._pending.get(response_id))

    def ended_on(self, response_id: str) -> str | None:
        """The lane ``response_id`` ran on, if it has ended on this stream."""
        ended = self._ended.get(response_id)
        return ended[0] if ended is not None else None

    # -- steers -----------------------------------------------------------------------------

    def refuse_unknown(self, target: str, raw_input: JSONValue) -> Emit:
        """A steer for a response that is not running: ended, or never known here."""
        ended = self._ended.get(target)
        if ended is None:
            message = f"No response '{target}' is active on this connection."
            return self.refuse("", target, raw_input, "response_not_found", message)
        lane_id, completed = ended
        code = "response_already_completed" if completed else "response_not_active"
        message = f"Response '{target}' has ended and takes no more steering input."
        return self.refuse(lane_id, target, raw_input, code, message)

    def accept(
        self,
        lane_id: str,
        target: str,
        raw_input: JSONValue,
        items: tuple[JSONObject, ...],
        waiting: bool,
    ) -> tuple[list[Emit], bool]:
        """A steer for running ``target`` (``waiting``: for tool outputs): its answers, and
        whether the target must now stop at its next boundary (its first pending steer)."""
        pending = self._pending.setdefault(target, [])
        if len(pending) >= self.limits.max_pending_steers:
            message = (
                f"Response '{target}' already has {len(pending)} pending steering inputs "
                f"(at most {self.limits.max_pending_steers})."
            )
            return [
                self.refuse(lane_id, target, raw_input, "too_many_pending_steers", message)
            ], False
        steer = Steer(self._new_steer_id(), target, raw_input, items)
        pending.append(steer)
        answers = [Emit(lane_id, steer_accepted(steer.id, target, self.next_seq()))]
        if waiting:
            return answers + self.announce(lane_id, [steer], self._stubs.get(target, [])), False
        return answers, len(pending) == 1

    def waiting(self, lane_id: str, response_id: str, stubs: list[RequiredInputStub]) -> list[Emit]:
        """``response_id`` waits for client tool outputs: its steers wait for them too."""
        self._stubs[response_id] = stubs
        return self.announce(lane_id, self._pending.get(response_id, []), stubs)

    def resumed(self, response_id: str) -> list[Steer]:
        """The tool outputs came: the pending steers, taken (committed) in submission order."""
        self._stubs.pop(response_id, None)
        return self._pending.pop(response_id, [])

    def ended(self, lane_id: str, response_id: str, completed: bool) -> list[Steer]:
        """``response_id`` ended (``completed``: or incomplete): its pending steers, taken."""
        self._stubs.pop(response_id, None)
        self._ended[response_id] = (lane_id, completed)
        while len(self._ended) > _ENDED_REMEMBERED:
            self._ended.popitem(last=False)
        return self._pending.pop(response_id, [])

    # -- answers ----------------------------------------------------------------------------

    def announce(
        self, lane_id: str, steers: list[Steer], required: list[RequiredInputStub]
    ) -> list[Emit]:
        """``response.steer.pending`` for each steer not announced yet."""
        events: list[Emit] = []
        for steer in steers:
            if steer.announced:
                continue
            steer.announced = True
            event = steer_pending(steer.id, steer.target, required, self.next_seq())
            events.append(Emit(lane_id, event))
        return events

    def fail(self, lane_id: str, steers: list[Steer], code: str, message: str) -> list[Emit]:
        """``response.steer.failed`` for each accepted steer, with its id."""
        return [
            self.refuse(lane_id, steer.target, steer.input, code, message, steer.id)
            for steer in steers
        ]

    def refuse(
        self,
        lane_id: str,
        target: str,
        raw_input: JSONValue,
        code: str,
        message: str,
        steer_id: str | None = None,
    ) -> Emit:
        event = steer_failed(target, raw_input, code, message, steer_id, self.next_seq())
        return Emit(lane_id, event)
