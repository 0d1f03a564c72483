"""The core, one subpackage per concern:

- ``api``: items, the Response and its events, client events, request parsing;
- ``lanes``: a stream's session, its lanes and their lifecycle machine, the stream cache;
- ``runs``: one response from request to terminal event;
- ``rendering``: tokenizer and chat format;
- ``storage``: stored responses, ledger, journal, post-inference writes, handoff;
- ``tenancy``: keys, tenants, limits;
- ``observability``: counters, metrics, log-safe text.

Beside them: ``service`` (the facade), ``transport_ports`` (all the transports may use of the
core: the ports this package offers), ``routing`` (model aliases to engines), ``one_shot``
(compact, token counts, models), ``compaction`` and ``malloc_trim``.
"""

from .transport_ports import (
    OneShotPort,
    StreamPort,
    StreamSession,
    TransportNaming,
    TransportPort,
)

__all__ = [
    "OneShotPort",
    "StreamPort",
    "StreamSession",
    "TransportNaming",
    "TransportPort",
]
