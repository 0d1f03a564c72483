"""The core's one-shot operations beside create: compact, input token counts, models.

None of them samples. Compaction and token counts render with the same renderer a create
uses, over the same conversation a create would see (``previous_response_id`` resolves from
the durable store, as for any request without a stream cache), so their counts agree with a
create's ``usage.input_tokens``.
"""

from __future__ import annotations

import time

from bidi_responses.schema import (
    CompactionResponse,
    InputTokensCount,
    Item,
    JSONObject,
    JSONValue,
    MessageItem,
    ModelList,
    ModelObject,
)

from .api.errors import ApiError, shown
from .api.fields import opt_str, optional_model, required_model
from .api.ids import new_id
from .api.input_items import parse_input
from .api.jsonshape import check_json_shape
from .api.requests import parse_create
from .runs.compaction import is_kept
from .runs.deps import RunDeps
from .runs.offload import item_chars, offload, request_chars
from .runs.record import Usage
from .storage.history import stored_history
from .storage.postinference import PostJob
from .storage.store import LedgerRow
from .tenancy.caller import ANONYMOUS, Caller


def _object_body(body: JSONValue) -> JSONObject:
    if not isinstance(body, dict):
        raise ApiError("The request body must be a JSON object.", code="invalid_type")
    check_json_shape(body)  # the same nesting and number rules as a create
    return body


class OneShotOps:
    """The operations of this module, over the parts they use (built by ``server/assembly.py``)."""

    def __init__(self, deps: RunDeps, started_at: int) -> None:
        self.config = deps.config
        self.router = deps.router
        self.renderer = deps.renderer
        self.store = deps.store
        self.post = deps.post
        self.compaction = deps.compaction
        self.started_at = started_at

    async def _conversation(
        self, previous: str | None, new_input: list[Item], tenant: str | None
    ) -> tuple[list[Item], list[str]]:
        """History (if any) plus the new input, with the JSON path of each item; checks
        every compaction token."""
        history = (
            (await stored_history(self.store, self.config.limits, previous, tenant))[0]
            if previous
            else []
        )
        items = history + new_input
        paths = [f"history[{i}]" for i in range(len(history))]
        paths += [f"input[{i}]" for i in range(len(new_input))]
        for item, path in zip(items, paths, strict=True):
            if item["type"] == "compaction":
                self.compaction.check(item, path)
        return items, paths

    # -- POST /v1/responses/compact ------------------------------------------------------------

    async def compact(
        self, raw: JSONValue, transport: str, caller: Caller = ANONYMOUS
    ) -> CompactionResponse:
        """Compact a conversation: its user messages, then one sealed ``compaction`` item.

        The pass is accounted in the usage ledger like a response (status ``compaction``),
        to the authenticated tenant (on an open server: the body's ``user`` or the token's
        label).
        """
        body = _object_body(raw)
        model = required_model(body)
        self.router.resolve(model)
        instructions = opt_str(body, "instructions")
        previous = opt_str(body, "previous_response_id") or None
        safety_identifier = opt_str(body, "safety_identifier")
        new_input, _ = parse_input(body.get("input"), self.config.limits)
        items, _ = await self._conversation(previous, new_input, caller.tenant)

        size = len(instructions or "") + item_chars(items)
        prompt = await offload(
            size, self.config.limits, self.renderer.render_conversation, instructions, [], items
        )
        summary = self.compaction.summarize(item for item in items if not is_kept(item))
        created_at = int(time.time())
        token = self.compaction.seal(
            {"summary": summary, "model": model, "items": len(items), "created_at": created_at}
        )
        output: list[Item] = []
        for item in items:
            if is_kept(item):
                kept: MessageItem = {
                    "id": item.get("id") or new_id("msg"),
                    **item,
                    "status": "completed",
                }
                output.append(kept)
        output.append({"id": new_id("cmp"), "type": "compaction", "encrypted_content": token})
        usage = Usage(
            input_tokens=len(prompt),
            output_tokens=len(self.renderer.encoding.encode_ordinary(summary)),
        )
        response_id = new_id("resp")
        ledger = LedgerRow(
            response_id=response_id,
            tenant=caller.account(opt_str(body, "user")),
            model=model,
            status="compaction",
            input_tokens=usage.input_tokens,
            cached_tokens=0,
            output_tokens=usage.output_tokens,
            engine_ms=0.0,
            api_pre_ms=0.0,
            api_post_ms=0.0,
            transport=transport,
            created_at=created_at,
            completed_at=created_at,
        )
        await self.post.put(PostJob(None, ledger))
        compacted: CompactionResponse = {
            "id": response_id,
            "object": "response.compaction",
            "created_at": created_at,
            "output": output,
            "usage": usage.to_dict(),
            # Echoed as a create echoes them (the SDK's CompactedResponse carries both).
            "safety_identifier": safety_identifier,
            "service_tier": "default",
        }
        return compacted

    # -- POST /v1/responses/input_tokens -------------------------------------------------------

    async def count_input_tokens(
        self, raw: JSONValue, tenant: str | None = None
    ) -> InputTokensCount:
        """The prompt tokens a create with this body would use (``usage.input_tokens``)."""
        body = _object_body(raw)
        model = optional_model(body)
        renderer = self.renderer
        if model is not None:
            # A real model's route may render in its own chat format (Harmony for gpt-oss).
            renderer = getattr(self.router.resolve(model).engine, "renderer", None) or renderer
        # A placeholder model satisfies the create parser.
        request = parse_create({**body, "model": model or "-"}, self.config.limits)
        items, _ = await self._conversation(request.previous_response_id, request.input, tenant)
        # Bounded like a create, and rendered off the event loop when large (core/work.py).
        size = request_chars(request, self.config.limits) + item_chars(items)
        tokens = await offload(
            size,
            self.config.limits,
            renderer.render_conversation,
            request.instructions,
            request.tools,
            items,
            request.output_format(),
        )
        return {"object": "response.input_tokens", "input_tokens": len(tokens)}

    # -- GET /v1/models ------------------------------------------------------------------------

    def _model(self, alias: str) -> ModelObject:
        return {
            "id": alias,
            "object": "model",
            "created": self.started_at,
            "owned_by": self.router.engine_name(alias) or "bidi-responses",
        }

    def list_models(self) -> ModelList:
        """The configured model aliases, OpenAI list shape."""
        return {"object": "list", "data": [self._model(a) for a in self.router.aliases]}

    def get_model(self, model_id: str) -> ModelObject:
        """One configured model (404 ``model_not_found`` if the alias is not configured)."""
        if model_id not in self.router.aliases:
            raise ApiError(
                f"The model '{shown(model_id)}' does not exist.",
                code="model_not_found",
                param="model",
                status=404,
            )
        return self._model(model_id)
