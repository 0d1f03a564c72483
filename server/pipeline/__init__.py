"""The pre-inference stages: validation and classifiers, run over each batch of new items.

Importing this package registers the built-in stages by name: ``validation``, ``secrets``
and ``injection``. See docs/pipeline.md for the stage interface and how to add one.
"""

from ..core.ports import Flag, Pipeline, Stage, StageInput, iter_texts
from . import injection as _injection  # noqa: F401
from . import secrets as _secrets  # noqa: F401
from . import validation as _validation  # noqa: F401
from .base import build_pipeline, load_stage, register_stage, registered_stages

__all__ = [
    "Flag",
    "Pipeline",
    "Stage",
    "StageInput",
    "build_pipeline",
    "iter_texts",
    "load_stage",
    "register_stage",
    "registered_stages",
]
