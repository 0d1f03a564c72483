"""The core, one subpackage per concern, each offering its public surface in its ``__init__``:

- ``api``: requests and client events parsed and checked into typed values, errors, ids;
- ``conversation``: a conversation's reusable state and the caches that keep it;
- ``rendering``: tokenizer and chat format;
- ``runs``: one response from request to terminal event, with its steps (continuation,
  append, terminal), model routing and compaction;
- ``lanes``: a stream's session, its lanes and their sans-I/O lifecycle machine;
- ``storage``: stored responses, ledger, journal, post-inference writes, handoff;
- ``tenancy``: keys, tenants, limits, the server-wide request budget;
- ``observability``: counters, metrics, log-safe text;
- ``process``: what is open, idle memory trim, cleanup a cancellation cannot cut short;
- ``ports``: what engines and pre-inference stages plug into.

Beside them: ``service`` (the facade the application builds, starts, drains and closes),
``transport_ports`` (all the transports may use of the core, offered here) and ``one_shot``
(compact, token counts, models).
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
