"""How a transport names what its streams report: data the application hands the core with each
stream, so that the core never asks which transport it serves."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StreamNaming:
    """The names a stream's transport gives to what the core reports on it."""

    # The transport's label in metrics, the usage ledger and logs ("grpc", "websocket").
    transport: str
    # The code of a create refused because the stream has as many lanes as it may.
    lane_limit_code: str = "stream_limit_reached"
    # The codes of the connection age limit: ``<prefix>_approaching``, ``<prefix>_reached``.
    age_limit_prefix: str = "connection_age_limit"
