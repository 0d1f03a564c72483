"""The ports the core defines for its plugins: inference engines and pre-inference stages.

``server/engines`` and ``server/pipeline`` import from the core only this package. It holds
the engine interface and the events an engine streams back (``engine``), the stage interface,
its value types and the pipeline that runs the stages (``stage``), and running work off the
event loop (``worker_thread``). It also names what the plugins share with the core from its
other packages: the error a client sees (``ApiError``), the request a stage examines, the
renderer and tokenizer the token engines build prompts with, and JSON normalization.
"""

from ..api.errors import ApiError, shown
from ..api.jsonshape import canonical_json, plain_numbers
from ..api.requests import CreateRequest
from ..api.tools import FunctionSpec
from ..conversation.state import CarriedState
from ..rendering.render import Renderer, RenderMemo, TokenArray, common_prefix
from ..rendering.tokenizer import (
    CALL,
    CHANNEL,
    CONSTRAIN,
    END,
    MESSAGE,
    RETURN,
    START,
    TokenizerUnavailable,
    load_encoding,
    o200k_vocab_file,
)
from .engine import (
    Delta,
    Engine,
    EngineAffinity,
    EngineConversation,
    EngineError,
    EngineEvent,
    EngineFinish,
    EngineRequest,
    ItemEnd,
    ItemStart,
    close_engine,
)
from .stage import (
    Flag,
    Pipeline,
    Stage,
    StageCounters,
    StageInput,
    iter_texts,
)
from .worker_thread import in_worker_thread, off_loop_from

__all__ = [
    "CALL",
    "CHANNEL",
    "CONSTRAIN",
    "END",
    "MESSAGE",
    "RETURN",
    "START",
    "ApiError",
    "CarriedState",
    "CreateRequest",
    "Delta",
    "Engine",
    "EngineAffinity",
    "EngineConversation",
    "EngineError",
    "EngineEvent",
    "EngineFinish",
    "EngineRequest",
    "Flag",
    "FunctionSpec",
    "ItemEnd",
    "ItemStart",
    "Pipeline",
    "RenderMemo",
    "Renderer",
    "Stage",
    "StageCounters",
    "StageInput",
    "TokenArray",
    "TokenizerUnavailable",
    "canonical_json",
    "close_engine",
    "common_prefix",
    "in_worker_thread",
    "iter_texts",
    "load_encoding",
    "o200k_vocab_file",
    "off_loop_from",
    "plain_numbers",
    "shown",
]
