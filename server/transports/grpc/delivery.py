"""What goes out on a stream: the client's ``DeliveryOptions``, and events as wire messages.

Events that are ready together become one message each, or are batched into one message when
the client asked for it (``batch_events``), within the server's bounds.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from bidi_responses.codec import EVENT_FIELD, ProtoEncoder, batch_messages, field_bytes
from bidi_responses.schema import ServerEvent
from bidi_responses.v1 import responses_pb2 as pb

from ...config import StreamingConfig
from ...core.api import ApiError, server_error
from ...core.runs import OutEvent, error_event

log = logging.getLogger("bidi_responses.grpc")

#: The coarsest delta window a client may choose (``DeliveryOptions.delta_window_ms``).
MAX_DELTA_WINDOW_MS = 100


@dataclass(slots=True)
class Delivery:
    """How one Connect stream or CreateResponse call wants its events (``DeliveryOptions``)."""

    max_events: int = 1
    max_bytes: int = 0
    slim: bool = False
    json_parameters: bool = False  # DeliveryOptions.tool_parameters_json
    # DeliveryOptions.delta_window_ms (None: the server's window).
    delta_window_ms: float | None = None

    @classmethod
    def from_pb(cls, options: pb.DeliveryOptions, streaming: StreamingConfig) -> Delivery:
        """Checked options, within the server's bounds (ApiError naming the bad field)."""
        detail = options.snapshot_detail
        if detail not in (
            pb.SNAPSHOT_DETAIL_UNSPECIFIED,
            pb.SNAPSHOT_DETAIL_FULL,
            pb.SNAPSHOT_DETAIL_SLIM,
        ):
            raise ApiError(
                f"Invalid 'delivery.snapshot_detail': unknown value {detail} (expected "
                "SNAPSHOT_DETAIL_FULL or SNAPSHOT_DETAIL_SLIM).",
                param="delivery.snapshot_detail",
            )
        max_events = 1
        if options.batch_events:
            max_events = streaming.max_batch_events
            if options.max_batch_events:
                max_events = min(max_events, options.max_batch_events)
        window = None
        if options.delta_window_ms:
            window = float(min(options.delta_window_ms, MAX_DELTA_WINDOW_MS))
        return cls(
            max(max_events, 1),
            streaming.max_batch_bytes,
            detail == pb.SNAPSHOT_DETAIL_SLIM,
            options.tool_parameters_json,
            window,
        )

    def streaming(self, server: StreamingConfig) -> StreamingConfig:
        """The server's streaming settings with this delivery's delta window, if it has one."""
        if self.delta_window_ms is None or not server.coalesce_deltas:
            return server
        return dataclasses.replace(server, delta_window_ms=self.delta_window_ms)

    def messages(self, encoder: ProtoEncoder, ready: Iterable[OutEvent]) -> list[bytes]:
        """The events that are ready, as serialized ``ConnectResponse`` messages (batched if
        this delivery asks for it)."""
        messages = [_encoded(encoder, out) for out in ready]
        if self.max_events > 1 and len(messages) > 1:
            return batch_messages(messages, self.max_events, self.max_bytes)
        return messages


def _encoded(encoder: ProtoEncoder, out: OutEvent) -> bytes:
    """One event's bytes; an event the encoder cannot map (a server fault) becomes a 500
    ``error`` event on its lane, so the stream goes on instead of ending INTERNAL."""
    try:
        return encoder.event_bytes(out.lane, out.data)
    except Exception:
        log.exception("Connect: could not encode a %r event", out.data.get("type"))
        error = server_error()
        return encoder.event_bytes(out.lane, error_event(error.status, error.to_error_object()))


class Outbound:
    """A stream's current delivery and the encoder that follows it; the client may change the
    delivery at any message, and it applies to everything emitted from then on."""

    def __init__(self, delivery: Delivery | None = None) -> None:
        self.delivery = delivery or Delivery()
        self.encoder = ProtoEncoder(
            slim=self.delivery.slim, json_parameters=self.delivery.json_parameters
        )

    def use(self, delivery: Delivery) -> None:
        """Apply new delivery options."""
        self.delivery = delivery
        self.encoder.slim = delivery.slim
        self.encoder.json_parameters = delivery.json_parameters

    def messages(self, ready: Iterable[OutEvent]) -> list[bytes]:
        """Serialized ``ConnectResponse`` messages for the events that are ready."""
        return self.delivery.messages(self.encoder, ready)

    def event_field(self, data: ServerEvent) -> bytes:
        """One event as a serialized ``CreateResponseResponse``."""
        return as_create_response(self.encoder.event_bytes("", data))


def as_create_response(connect_response: bytes) -> bytes:
    """A serialized ``ConnectResponse`` as a serialized ``CreateResponseResponse`` (its
    ``event`` field), without decoding it."""
    return field_bytes(EVENT_FIELD, connect_response)
