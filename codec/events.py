"""The server events' names and shapes, shared by the encoder and the decoder.

An event's JSON ``type`` is its ``ConnectResponse`` oneof case with dots for underscores
(``"response.output_text.delta"`` <-> ``response_output_text_delta``). Most events carry only
scalars named alike on both sides, so one table describes them for both directions.
"""

from __future__ import annotations

#: Events that carry a whole Response.
SNAPSHOT_TYPES = frozenset(
    {
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.completed",
        "response.failed",
        "response.incomplete",
    }
)
#: Snapshots that end a response.
TERMINAL_SNAPSHOT_TYPES = SNAPSHOT_TYPES - {
    "response.created",
    "response.queued",
    "response.in_progress",
}
#: Events that carry one output item (``output_index``, ``item``).
ITEM_EVENT_TYPES = frozenset({"response.output_item.added", "response.output_item.done"})
#: Events that carry one content part (``item_id``, ``output_index``, ``content_index``, ``part``).
PART_EVENT_TYPES = frozenset({"response.content_part.added", "response.content_part.done"})
PART_EVENT_FIELDS = ("item_id", "output_index", "content_index")

#: Events of scalar fields (besides ``sequence_number``) and their fields: the deltas and dones.
SCALAR_EVENTS: dict[str, tuple[str, ...]] = {
    "response.output_text.delta": ("item_id", "output_index", "content_index", "delta"),
    "response.function_call_arguments.delta": ("item_id", "output_index", "delta"),
    "response.output_text.done": ("item_id", "output_index", "content_index", "text"),
    "response.function_call_arguments.done": ("item_id", "output_index", "arguments", "name"),
}

#: Steering and injection acknowledgements (``codec.steering``, ``codec.injection``).
STEER_EVENT_TYPES = frozenset(
    {
        "response.steer.accepted",
        "response.steer.failed",
        "response.steer.pending",
        "response.inject.created",
        "response.inject.failed",
    }
)

#: Every event type with a case of its own in ``ConnectResponse``.
EVENT_TYPES = (
    SNAPSHOT_TYPES
    | ITEM_EVENT_TYPES
    | PART_EVENT_TYPES
    | SCALAR_EVENTS.keys()
    | STEER_EVENT_TYPES
    | {"response.done", "error", "warning"}
)
#: JSON event type -> ``ConnectResponse`` oneof case.
CASE_OF_TYPE = {kind: kind.replace(".", "_") for kind in EVENT_TYPES}
#: ``ConnectResponse`` oneof case -> JSON event type.
TYPE_OF_CASE = {case: kind for kind, case in CASE_OF_TYPE.items()}
