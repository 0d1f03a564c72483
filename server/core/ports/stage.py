"""The stage port: what a pre-inference stage is given, returns and carries, and the pipeline
that runs the stages in order over each turn's new items.

A stage sees only the items that are new to the conversation, plus a small dict of state it
carries from earlier turns of the same stream (``carried``). It may raise ApiError to block the
request, or return flags that are reported on the response. The stages themselves, and the
loading of them by name, live in ``server/pipeline``; see docs/pipeline.md.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Protocol

from bidi_responses.schema import Item, JSONObject, SafetyFlagObject

from ..api.errors import ApiError
from ..api.requests import CreateRequest
from ..conversation.state import CarriedState
from ..observability.logsafe import printable

#: Batches with at least this many characters of text are examined off the event loop
#: (``limits.offload_chars`` sets the pipeline's figure).
DEFAULT_OFFLOAD_CHARS = 65_536
# The pipeline's verdict lines keep the logger name stage authors and operators know.
log = logging.getLogger("bidi_responses.server.pipeline.base")


@dataclass(frozen=True, slots=True)
class Flag:
    """A non-blocking verdict on one item."""

    classifier: str
    code: str
    param: str
    message: str

    def to_dict(self) -> SafetyFlagObject:
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
    # Set by the pipeline from its configuration; see ``examine_off_loop``.
    offload_chars: int = DEFAULT_OFFLOAD_CHARS

    @property
    def chars(self) -> int:
        """Characters of text in the batch's items (what the classifiers read)."""
        return sum(len(text) for item in self.items for _, text in iter_texts(item, ""))


class Stage(Protocol):
    """One pre-inference stage.

    ``name`` keys the stage's counters (``stats.stage_items``/``stage_ms``) and its carried
    state, so it must be unique within a pipeline. A stage may also define ``close()`` (plain
    or async), called once when the server stops, to release a thread or process pool.
    """

    name: str

    async def examine(self, batch: StageInput, carried: CarriedState) -> list[Flag]:
        """Examine the new items; raise ApiError to block, return flags to report."""
        ...


def iter_texts(item: Item, path: str) -> Iterator[tuple[str, str]]:
    """The text an item carries, as ``(json_path, text)`` pairs.

    Message text parts (``input[0].content[1].text``), refusals, function call arguments,
    tool outputs (``input[3].output``), custom tool input/output and reasoning summaries.
    Classifiers use it so that every stage agrees on what "the item's text" is.
    """
    if item["type"] == "message":
        for index, part in enumerate(item["content"]):
            if part["type"] == "input_image":
                continue
            key, text = (
                ("refusal", part["refusal"])
                if part["type"] == "refusal"
                else ("text", part["text"])
            )
            if text:
                yield f"{path}.content[{index}].{key}", text
    elif item["type"] == "function_call":
        if item["arguments"]:
            yield f"{path}.arguments", item["arguments"]
    elif item["type"] == "function_call_output" or item["type"] == "custom_tool_call_output":
        yield from _output_texts(item["output"], f"{path}.output")
    elif item["type"] == "custom_tool_call":
        if item.get("input"):
            yield f"{path}.input", item["input"]
    elif item["type"] == "reasoning":
        for index, summary in enumerate(item["summary"]):
            if summary["text"]:
                yield f"{path}.summary[{index}].text", summary["text"]


def _output_texts(output: str | list[JSONObject], path: str) -> Iterator[tuple[str, str]]:
    if isinstance(output, str):
        if output:
            yield path, output
        return
    for index, part in enumerate(output):
        # The item parser admits only content parts (objects); history read back from a
        # store written before that check may still hold anything.
        text = part.get("text") if isinstance(part, dict) else None
        if isinstance(text, str) and text:
            yield f"{path}[{index}].text", text


@dataclass(slots=True)
class StageCounters:
    """Items examined and time spent, per stage, for one response."""

    items: dict[str, int]
    ms: dict[str, float]


class Pipeline:
    """Runs the configured stages in order over each turn's new items."""

    def __init__(self, stages: Sequence[Stage], offload_chars: int = DEFAULT_OFFLOAD_CHARS) -> None:
        self.stages = list(stages)
        self.offload_chars = offload_chars
        names = [stage.name for stage in self.stages]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(
                f"pipeline stage names must be unique; repeated: {', '.join(duplicates)}"
            )

    @property
    def names(self) -> list[str]:
        """Stage names in order."""
        return [stage.name for stage in self.stages]

    async def close(self) -> None:
        """Let every stage release what it holds (``close()``, plain or async, if defined).

        A stage whose ``close`` fails is logged; the others still close.
        """
        for stage in self.stages:
            close = getattr(stage, "close", None)
            if close is None:
                continue
            try:
                result = close()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("pipeline stage %s failed to close", stage.name)

    async def run(
        self,
        batch: StageInput,
        stage_state: dict[str, CarriedState],
        counters: StageCounters,
    ) -> list[Flag]:
        """Run every stage over ``batch``; the first blocking stage's ApiError propagates."""
        if batch.offload_chars != self.offload_chars:
            batch = dataclasses.replace(batch, offload_chars=self.offload_chars)
        flags: list[Flag] = []
        for stage in self.stages:
            carried = stage_state.get(stage.name)
            if carried is None:
                carried = stage_state[stage.name] = {}
            started = time.perf_counter()
            try:
                found = await stage.examine(batch, carried)
            except ApiError as error:
                _log_verdict(stage, "blocked a request:", error.code, error.param, batch.request)
                raise
            finally:
                counters.items[stage.name] = counters.items.get(stage.name, 0) + len(batch.items)
                counters.ms[stage.name] = (
                    counters.ms.get(stage.name, 0.0) + (time.perf_counter() - started) * 1000
                )
            for flag in found:
                _log_verdict(stage, "flagged", flag.code, flag.param, batch.request)
            flags.extend(found)
        return flags


def _log_verdict(
    stage: Stage, verdict: str, code: str, param: str | None, request: CreateRequest
) -> None:
    """One log line per stage verdict, with the client's values made printable."""
    log.info(
        "stage %s %s %s at %s (model %s, user %s)",
        stage.name,
        verdict,
        code,
        printable(param),
        printable(request.model),
        printable(request.user or "-"),
    )
