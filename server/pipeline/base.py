"""The pre-inference pipeline: stages that examine each turn's new items.

A stage sees only the items that are new to the conversation, plus a small dict of state it
carries from earlier turns of the same stream (``carried``). It may raise ApiError to block the
request, or return flags that are reported on the response. Model-backed classifiers can run
off the event loop: ``examine`` is a coroutine, so a stage may ``await asyncio.to_thread(...)``.

Register a stage class with ``register_stage`` or name it as ``module:attribute`` (or
``path/to/file.py:attribute``) in the server configuration's ``stages`` list; settings from
``stage_settings`` are passed to the factory as keyword arguments. See docs/pipeline.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import logging
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, Protocol, TypeAlias, TypeVar

from bidi_responses.schema import Item, JSONObject, JSONValue, SafetyFlagObject

from ..core.api.errors import ApiError
from ..core.api.requests import CreateRequest
from ..core.lanes.state import CarriedState
from ..core.observability.logsafe import printable
from ..core.runs.worker_thread import off_loop_from

#: A stage's ``stage_settings``, as the configuration file gives them.
StageSettings: TypeAlias = Mapping[str, JSONValue]

#: Batches with at least this many characters of text are examined off the event loop
#: (``limits.offload_chars`` sets the pipeline's figure).
DEFAULT_OFFLOAD_CHARS = 65_536
#: A text longer than this is scanned in windows (``text_windows``), so no single regular
#: expression call holds the GIL for long while the event loop waits for it.
WINDOW_CHARS = 65_536
#: How much consecutive windows overlap (at least half of it, the next window starting at a
#: space): a match shorter than half of this is never cut in two.
WINDOW_OVERLAP = 4096

P = ParamSpec("P")
T = TypeVar("T")


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


async def examine_off_loop(
    batch: StageInput, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """``work(*args, **kwargs)``, in a worker thread when the batch is large (at least
    ``batch.offload_chars`` characters), inline otherwise (a thread hop costs more than
    examining a small batch). The stage's coroutine waits; the event loop does not."""
    return await off_loop_from(batch.chars, batch.offload_chars, work, *args, **kwargs)


def text_windows(
    text: str, size: int = WINDOW_CHARS, overlap: int = WINDOW_OVERLAP
) -> Iterator[str]:
    """``text`` in windows of about ``size`` characters, each starting ``overlap`` characters
    (at whitespace where there is some) before the previous one ends; a short text whole.

    A scan over the windows finds every match shorter than half the overlap, some twice.
    """
    for start, end in window_spans(len(text), text, size, overlap):
        yield text if end - start == len(text) else text[start:end]


def window_spans(
    length: int, text: str, size: int = WINDOW_CHARS, overlap: int = WINDOW_OVERLAP
) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each of ``text_windows``' windows."""
    if length <= size + overlap:
        yield 0, length
        return
    start = 0
    while True:
        end = start + size + overlap
        if end >= length:
            yield start, length
            return
        yield start, end
        resume = end - overlap
        space = _next_space(text, resume, end - overlap // 2)
        start = space if space is not None else resume


def _next_space(text: str, start: int, stop: int) -> int | None:
    """The first space or newline in ``text[start:stop]``, or None."""
    found = [i for i in (text.find(" ", start, stop), text.find("\n", start, stop)) if i >= 0]
    return min(found) if found else None


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


StageFactory = Callable[..., Stage]
_REGISTRY: dict[str, StageFactory] = {}
log = logging.getLogger(__name__)


def register_stage(name: str, factory: StageFactory) -> None:
    """Make a stage available by name in the configuration's ``stages`` list."""
    _REGISTRY[name] = factory


def registered_stages() -> list[str]:
    """Names of the registered stages, sorted."""
    return sorted(_REGISTRY)


def _resolve_factory(spec: str) -> StageFactory:
    if spec in _REGISTRY:
        return _REGISTRY[spec]
    if ":" not in spec:
        known = ", ".join(sorted(_REGISTRY))
        raise ValueError(f"unknown pipeline stage '{spec}' (known: {known}; or module:attribute)")
    module_name, attribute = spec.rsplit(":", 1)
    if module_name.endswith(".py") or "/" in module_name:
        path = Path(module_name).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"pipeline stage '{spec}': no file {path}")
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
        unique = f"bidi_responses_stage_{path.stem}_{digest}"
        module = sys.modules.get(unique)
        if module is None:
            file_spec = importlib.util.spec_from_file_location(unique, path)
            if file_spec is None or file_spec.loader is None:
                raise ValueError(f"pipeline stage '{spec}': cannot import {path}")
            module = importlib.util.module_from_spec(file_spec)
            sys.modules[unique] = module
            file_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise ValueError(
                f"pipeline stage '{spec}': cannot import '{module_name}' "
                f"({error}); is it on PYTHONPATH?"
            ) from error
    factory = getattr(module, attribute, None)
    if factory is None or not callable(factory):
        raise ValueError(f"pipeline stage '{spec}': '{module_name}' has no callable '{attribute}'")
    result: StageFactory = factory
    return result


def load_stage(spec: str, settings: StageSettings | None = None) -> Stage:
    """A stage by registered name or ``module:attribute`` (a class or factory).

    ``settings`` are passed to the factory as keyword arguments; an unknown setting is a
    ValueError that names the stage.
    """
    factory = _resolve_factory(spec)
    kwargs = dict(settings or {})
    if kwargs:
        try:
            inspect.signature(factory).bind(**kwargs)
        except TypeError as error:
            raise ValueError(
                f"pipeline stage '{spec}': bad settings {sorted(kwargs)}: {error}"
            ) from error
        except ValueError:  # no signature available (a builtin): let the call decide
            pass
    stage: Stage = factory(**kwargs)
    if not isinstance(getattr(stage, "name", None), str) or not callable(
        getattr(stage, "examine", None)
    ):
        raise ValueError(
            f"pipeline stage '{spec}': the factory must return an object with a "
            "'name' string and an async 'examine(batch, carried)' method"
        )
    return stage


def build_pipeline(
    specs: Sequence[str], settings: Mapping[str, StageSettings] | None = None
) -> Pipeline:
    """The pipeline a configuration names: ``stages`` in order, each with its settings."""
    settings = settings or {}
    unused = set(settings) - set(specs)
    if unused:
        raise ValueError(
            f"stage_settings for stages that are not configured: "
            f"{', '.join(sorted(unused))} (stages: {', '.join(specs)})"
        )
    return Pipeline([load_stage(spec, settings.get(spec)) for spec in specs])


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
