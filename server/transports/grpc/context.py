"""What a servicer call's context tells the transport: who is calling."""

from __future__ import annotations

from typing import Any

import grpc

from ...core.tenancy import ApiKeys
from ..admission import Caller, identify

# A servicer call's context; the message types vary by method and do not matter here.
Context = grpc.aio.ServicerContext[Any, Any]


def _authorization(context: Context) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return value if isinstance(value, str) else value.decode()
    return None


def caller_of(keys: ApiKeys, context: Context) -> Caller:
    """The call's caller from its ``authorization`` metadata; ApiError 401 when keys are on
    and the key is missing or wrong."""
    return identify(keys, _authorization(context), context.peer())
