"""The pre-inference pipeline: stages that examine each turn's new items.

A stage sees only the items that are new to the conversation, plus a small dict of state it
carries from earlier turns of the same stream (``carried``). It may raise ApiError to block the
request, or return flags that are reported on the response. Model-backed classifiers can run
off the event loop: ``examine`` is a coroutine, so a stage may ``await asyncio.to_thread(...)``.

Register a stage class with ``register_stage`` or name it as ``module:attribute`` in the
server configuration's ``stages`` list.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Protocol

from bidi_responses.server.core.requests import CreateRequest, Item


@dataclass(frozen=True, slots=True)
class Flag:
    """A non-blocking verdict on one item."""

    classifier: str
    code: str
    param: str
    message: str

    def to_dict(self) -> dict[str, str]:
        """JSON form, as on ``response.safety_flags``."""
        return {
            "classifier": self.classifier,
            "code": self.code,
            "param": self.param,
            "message": self.message,
        }


@dataclass(frozen=True, slots=True)
class StageInput:
    """What a stage is given: the new items with their JSON paths, and the request.

    ``known_calls`` (call id -> function name) and ``answered_calls`` describe the
    conversation before these items; the core keeps them up to date, model output included.
    """

    items: Sequence[Item]
    paths: Sequence[str]
    request: CreateRequest
    declared_functions: frozenset[str]
    known_calls: Mapping[str, str]
    answered_calls: AbstractSet[str]


class Stage(Protocol):
    """One pre-inference stage."""

    name: str

    async def examine(self, batch: StageInput, carried: dict[str, Any]) -> list[Flag]:
        """Examine the new items; raise ApiError to block, return flags to report."""
        ...


StageFactory = Callable[[], Stage]
_REGISTRY: dict[str, StageFactory] = {}


def register_stage(name: str, factory: StageFactory) -> None:
    """Make a stage available by name in the configuration's ``stages`` list."""
    _REGISTRY[name] = factory


def load_stage(spec: str) -> Stage:
    """A stage by registered name or ``module:attribute`` (a class or factory)."""
    if spec in _REGISTRY:
        return _REGISTRY[spec]()
    if ":" not in spec:
        known = ", ".join(sorted(_REGISTRY))
        raise ValueError(f"unknown pipeline stage '{spec}' (known: {known}; or module:attribute)")
    module_name, attribute = spec.split(":", 1)
    factory = getattr(importlib.import_module(module_name), attribute)
    stage: Stage = factory()
    return stage


@dataclass(slots=True)
class StageCounters:
    """Items examined and time spent, per stage, for one response."""

    items: dict[str, int]
    ms: dict[str, float]


class Pipeline:
    """Runs the configured stages in order over each turn's new items."""

    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages = list(stages)

    async def run(
        self,
        batch: StageInput,
        stage_state: dict[str, Any],
        counters: StageCounters,
    ) -> list[Flag]:
        """Run every stage over ``batch``; the first blocking stage's ApiError propagates."""
        flags: list[Flag] = []
        for stage in self.stages:
            carried = stage_state.get(stage.name)
            if carried is None:
                carried = stage_state[stage.name] = {}
            started = time.perf_counter()
            try:
                flags.extend(await stage.examine(batch, carried))
            finally:
                counters.items[stage.name] = counters.items.get(stage.name, 0) + len(batch.items)
                counters.ms[stage.name] = counters.ms.get(stage.name, 0.0) + (
                    time.perf_counter() - started
                ) * 1000
        return flags
