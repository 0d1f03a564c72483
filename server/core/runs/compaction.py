"""Compaction: a long conversation becomes its user messages plus one opaque ``compaction`` item.

``POST /v1/responses/compact`` (and the gRPC ``CompactResponse``) returns what the hosted API
returns: every user message of the conversation, then a single ``compaction`` item whose
``encrypted_content`` stands for everything else. A client continues by sending that list (and
its new input) as the next request's input; the server renders the compaction item as one
short developer block, so the model sees a summary instead of the whole history.

The token is opaque to clients and integrity-protected: zlib-compressed JSON, authenticated
with HMAC-SHA256 under a server key, base64url-encoded. A client can neither forge nor alter
one (any change fails the check, and the request gets a 400 naming the item). The key comes
from the configured file, created with a random key on first use, so tokens survive restarts.
The summary is built by the server deterministically (no sampling): one line per item, each
cut to ``summary_item_chars``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import tempfile
import zlib
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import NotRequired, TypedDict, TypeGuard, cast

import orjson
from bidi_responses.schema import CompactionItem, Item, MessageItem, part_text

from ..api.errors import ApiError

_VERSION = 1
_TAG_BYTES = 32
# A decompressed payload larger than this is refused (a token cannot be a zip bomb).
_MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
KEY_FILE_NAME = "compaction.key"


class CompactionPayload(TypedDict):
    """What a token carries: the summary the model sees, and where it came from."""

    summary: str
    model: NotRequired[str]
    items: NotRequired[int]
    created_at: NotRequired[int]


def load_key(path: Path) -> bytes:
    """The server key in ``path``; a new random one is written there (mode 0600) if absent."""
    try:
        key = path.read_bytes().strip()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        key = secrets.token_hex(32).encode()
        # Written whole under a private name, then linked into place: a worker starting at
        # the same moment sees either no key or the whole key, never an empty file.
        fd, staged = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(key + b"\n")
                handle.flush()
                os.fsync(handle.fileno())
            try:
                os.link(staged, path)
            except FileExistsError:  # another process created it first: use theirs
                return load_key(path)
        finally:
            os.unlink(staged)
    if len(key) < 16:
        raise ValueError(f"the compaction key in {path} is shorter than 16 bytes")
    return key


class CompactionCodec:
    """Seals and opens compaction tokens under one server key."""

    def __init__(self, key: bytes, *, summary_item_chars: int = 400) -> None:
        if summary_item_chars < 16:
            raise ValueError(f"summary_item_chars must be >= 16, got {summary_item_chars}")
        self._key = hashlib.sha256(b"bidi-responses compaction v1\x00" + key).digest()
        self.summary_item_chars = summary_item_chars
        self._open_cached = lru_cache(maxsize=256)(self._open)

    def _tag(self, body: bytes) -> bytes:
        return hmac.new(self._key, body, hashlib.sha256).digest()

    def seal(self, payload: CompactionPayload) -> str:
        """An opaque token carrying ``payload``."""
        body = bytes([_VERSION]) + zlib.compress(orjson.dumps(payload), 6)
        return base64.urlsafe_b64encode(self._tag(body) + body).decode().rstrip("=")

    def _open(self, token: str) -> CompactionPayload:
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError):
            raise ValueError("not a compaction token") from None
        tag, body = raw[:_TAG_BYTES], raw[_TAG_BYTES:]
        if len(tag) < _TAG_BYTES or not body or not hmac.compare_digest(tag, self._tag(body)):
            raise ValueError("the token was not issued by this server, or was altered")
        if body[0] != _VERSION:
            raise ValueError(f"unknown token version {body[0]}")
        inflater = zlib.decompressobj()
        data = inflater.decompress(body[1:], _MAX_PAYLOAD_BYTES)
        if inflater.unconsumed_tail:
            raise ValueError("the token's payload is too large")
        payload = orjson.loads(data)
        if not isinstance(payload, dict) or not isinstance(payload.get("summary"), str):
            raise ValueError("the token has no summary")
        # Authentic (this server sealed it) and carrying its summary: a payload as sealed.
        return cast(CompactionPayload, payload)

    def open(self, token: str) -> CompactionPayload:
        """The payload of a token; ValueError if it is not authentic."""
        return self._open_cached(token)

    def check(self, item: CompactionItem, where: str) -> None:
        """ApiError (400, naming ``where``) unless the compaction item's token is authentic."""
        try:
            self.open(item["encrypted_content"])
        except ValueError as exc:
            raise ApiError(
                f"Invalid '{where}.encrypted_content': {exc}.",
                code="invalid_encrypted_content",
                param=f"{where}.encrypted_content",
            ) from None

    def summary(self, token: str) -> str:
        """The summary text a token carries (what the model sees in its place)."""
        try:
            return self.open(token)["summary"]
        except ValueError as exc:
            raise ApiError(
                f"Invalid 'encrypted_content' of a compaction item: {exc}.",
                code="invalid_encrypted_content",
            ) from None

    def summarize(self, items: Iterable[Item]) -> str:
        """One line per non-user item (earlier compactions keep their own summary)."""
        limit = self.summary_item_chars
        lines: list[str] = []
        names: dict[str, str] = {}  # call id -> function name (ids are random; names are not)
        for item in items:
            if item["type"] == "compaction":
                lines.append(self.summary(item["encrypted_content"]))
                continue
            if item["type"] == "message":
                text = "".join(part_text(p) for p in item.get("content") or ())
                line = f"{item['role']}: {text}"
            elif item["type"] == "function_call":
                names[item["call_id"]] = item["name"]
                line = f"called {item['name']}({item['arguments']})"
            elif item["type"] == "function_call_output":
                line = f"{names.get(item['call_id'], 'tool')} returned: {item['output']}"
            elif item["type"] == "reasoning":
                line = "thought: " + " ".join(p["text"] for p in item.get("summary") or ())
            else:
                line = f"{item['type']}: " + orjson.dumps(item).decode()
            line = " ".join(line.split())
            lines.append(line if len(line) <= limit else line[: limit - 3] + "...")
        return "\n".join(lines)


def is_kept(item: Item) -> TypeGuard[MessageItem]:
    """Items a compaction keeps verbatim: the user's messages."""
    return item["type"] == "message" and item["role"] == "user"
