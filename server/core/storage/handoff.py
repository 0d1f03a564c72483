"""Stream handoff: a draining replica leaves its conversations' cached state in a shared tier,
and the replica that gets the next turn restores it instead of re-rendering the history.

What the hosted API loses on reconnect, the cache of a stream (items, rendered tokens, call
map, checked tools, the stages' carried state), survives a drain here. (The route is not
carried: it is the new replica's own routing table that must serve the turn, and resolving an
alias is one lookup.)

* On SIGTERM, after its in-flight responses have finished, each stream saves the state it
  caches for its latest stored response (``save_session_states``), keyed by response id.
* A continuation whose ``previous_response_id`` is in no local cache first *takes* the saved
  state (one reader wins, as with the stream cache) and goes on as a cached turn: it renders and
  checks only the new input. Without a saved state (the replica died, or the snapshot expired)
  it rebuilds the history from the stored chain, as before.

A state is saved only for a chain that is fully stored (so it agrees with the store), and an
unclaimed state expires after ``ttl_s``. The encoding is data only (JSON plus raw token ids):
nothing read from the shared tier is executed.
"""

from __future__ import annotations

import dataclasses
import sys
from array import array
from typing import Any, Protocol, runtime_checkable

import orjson
from bidi_responses.schema import JSONValue

from ..conversation.state import ConversationState

_VERSION = 1


@runtime_checkable
class StateTier(Protocol):
    """Where draining replicas leave conversation states (the PostgreSQL store is one)."""

    async def save_states(self, states: list[tuple[str, bytes]], ttl_s: float) -> None:
        """Keep each (response id, encoded state); drop states older than ``ttl_s``."""
        ...

    async def take_state(self, response_id: str) -> bytes | None:
        """Remove and return the state saved for ``response_id``, if any."""
        ...


_TAGS = frozenset({"$b", "$d", "$s", "$t", "$o"})


def _plain(value: object) -> JSONValue:
    """A value as JSON: bytes, sets, tuples and dicts with non-string keys tagged (and a
    one-key dict whose key is a tag escaped), so ``_unplain`` restores it exactly."""
    if isinstance(value, bytes):
        return {"$b": value.hex()}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            plain = {k: _plain(v) for k, v in value.items()}
            return {"$o": plain} if len(plain) == 1 and next(iter(plain)) in _TAGS else plain
        return {"$d": [[_plain(k), _plain(v)] for k, v in value.items()]}
    if isinstance(value, (set, frozenset)):
        return {"$s": [_plain(v) for v in value]}
    if isinstance(value, tuple):
        return {"$t": [_plain(v) for v in value]}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _unplain(value: JSONValue) -> Any:
    """The value ``_plain`` was given, restored: of its state field's own type."""
    if isinstance(value, list):
        return [_unplain(v) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "$b":
            return bytes.fromhex(inner)
        if tag == "$d":
            return {_unplain(k): _unplain(v) for k, v in inner}
        if tag == "$s":
            return {_unplain(v) for v in inner}
        if tag == "$t":
            return tuple(_unplain(v) for v in inner)
        if tag == "$o":
            return {k: _unplain(v) for k, v in inner.items()}
    return {k: _unplain(v) for k, v in value.items()}


# Every field of the state travels, so a field added to ``ConversationState`` is handed off
# too; only the token ids get a compact form of their own.
_FIELDS = tuple(f.name for f in dataclasses.fields(ConversationState) if f.name != "tokens")


def encode_state(state: ConversationState) -> bytes:
    """A state as bytes: a JSON header, then the token ids as raw 32-bit integers."""
    header = {"v": _VERSION, "byteorder": sys.byteorder}
    header.update({name: _plain(getattr(state, name)) for name in _FIELDS})
    head = orjson.dumps(header)
    return len(head).to_bytes(8, "little") + head + state.tokens.tobytes()


def decode_state(blob: bytes) -> ConversationState:
    """The state that ``encode_state`` wrote; ValueError if unreadable."""
    size = int.from_bytes(blob[:8], "little")
    header = orjson.loads(blob[8 : 8 + size])
    if header.get("v") != _VERSION:
        raise ValueError(f"unknown state version {header.get('v')!r}")
    tokens = array("I")
    tokens.frombytes(blob[8 + size :])
    if header["byteorder"] != sys.byteorder:
        tokens.byteswap()
    missing = [name for name in _FIELDS if name not in header]
    if missing:
        raise ValueError(f"state lacks {', '.join(missing)}")
    state = ConversationState(tokens=tokens, **{name: _unplain(header[name]) for name in _FIELDS})
    return state
