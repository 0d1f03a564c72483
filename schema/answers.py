"""What the API answers besides a Response: its error object, a deletion, a page of input
items, a compaction, an input token count, the models.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from .items import Item
from .response_object import UsageObject


class ErrorObject(TypedDict):
    """OpenAI's error object: the body of an HTTP error and of an ``error`` event."""

    type: str
    code: str
    message: str
    param: str | None
    # The limit that was hit (gRPC ErrorInfo metadata, ``ApiError.metadata``).
    limit: NotRequired[str]
    limit_value: NotRequired[str]
    retry_after_s: NotRequired[str]
    # Which client request the error answers (``events.answers_to``).
    request_type: NotRequired[str]
    event_id: NotRequired[str]
    response_id: NotRequired[str]


class DeletedResponse(TypedDict):
    """The answer to deleting a stored response."""

    id: str
    object: Literal["response.deleted"]
    deleted: bool


class InputItemList(TypedDict):
    """One page of a stored response's input items (OpenAI's list shape)."""

    object: Literal["list"]
    data: list[Item]
    first_id: str | None
    last_id: str | None
    has_more: bool


class CompactionResponse(TypedDict):
    """The answer to ``POST /v1/responses/compact``."""

    id: str
    object: Literal["response.compaction"]
    created_at: int
    output: list[Item]
    usage: UsageObject
    # The request's, echoed (None when it sent none).
    safety_identifier: str | None
    # Always "default" (as a create echoes it).
    service_tier: str


class InputTokensCount(TypedDict):
    """The answer to ``POST /v1/responses/input_tokens``."""

    object: Literal["response.input_tokens"]
    input_tokens: int


class ModelObject(TypedDict):
    """One configured model alias (``GET /v1/models/{model}``)."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(TypedDict):
    object: Literal["list"]
    data: list[ModelObject]
