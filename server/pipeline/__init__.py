"""The request pipeline around inference: validation, classifiers, routing, post-inference.

Importing this package registers the built-in stages by name.
"""

from bidi_responses.server.pipeline import validation as _validation  # noqa: F401
from bidi_responses.server.pipeline.base import (
    Flag,
    Pipeline,
    Stage,
    StageInput,
    load_stage,
    register_stage,
)

__all__ = ["Flag", "Pipeline", "Stage", "StageInput", "load_stage", "register_stage"]
