"""Loading the pre-inference stages, and helpers for writing one.

The stage interface (``Stage``, ``StageInput``, ``Flag``) and the ``Pipeline`` that runs the
stages are the core's stage port (``core.ports``). Model-backed classifiers can run off the
event loop: ``examine`` is a coroutine, so a stage may ``await asyncio.to_thread(...)`` or use
``examine_off_loop``.

Register a stage class with ``register_stage`` or name it as ``module:attribute`` (or
``path/to/file.py:attribute``) in the server configuration's ``stages`` list; settings from
``stage_settings`` are passed to the factory as keyword arguments. See docs/pipeline.md.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import ParamSpec, TypeAlias, TypeVar

from bidi_responses.schema import JSONValue

from ..core.ports import Pipeline, Stage, StageInput, off_loop_from

#: A stage's ``stage_settings``, as the configuration file gives them.
StageSettings: TypeAlias = Mapping[str, JSONValue]

#: A text longer than this is scanned in windows (``text_windows``), so no single regular
#: expression call holds the GIL for long while the event loop waits for it.
WINDOW_CHARS = 65_536
#: How much consecutive windows overlap (at least half of it, the next window starting at a
#: space): a match shorter than half of this is never cut in two.
WINDOW_OVERLAP = 4096

P = ParamSpec("P")
T = TypeVar("T")


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


StageFactory = Callable[..., Stage]
_REGISTRY: dict[str, StageFactory] = {}


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
