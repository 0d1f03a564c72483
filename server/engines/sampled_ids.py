"""Every token id a backend sampled, whatever its stream reports per token.

The parsers build text from token bytes (an incremental UTF-8 decoder over each token's bytes,
as vLLM's and SGLang's detokenizers do), so a character split across tokens reaches the client
whole, provided every sampled id arrives, in order. Backends report them differently:

* vLLM and SGLang: ``token_ids``, every id (nothing to recover);
* llama.cpp: ``logprobs.content[]``, one entry per *piece of valid UTF-8*, not per token. A
  token that ends inside a character gets no entry; the next entry carries the id of the token
  that completed the character only, but the bytes (and text) of both, e.g. ``{"id": 124,
  "token": "°", "bytes": [194, 176]}`` for the tokens ``\\xc2`` and ``\\xb0``. The ids missing
  before an entry are the bytes it carries beyond its own token's bytes, split into tokens the
  way the model's tokenizer splits them (the tokenization the model was trained on) and
  counted as ``recovered``;
* text without any ids (no logprobs): the text is tokenized with the model's tokenizer, piece
  by piece as it streams, and counted as ``retokenized``; the backend's own
  ``completion_tokens`` is then the output count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import tiktoken
from bidi_responses.schema import JSONObject, JSONValue

__all__ = ["IdCounts", "TiktokenVocabulary", "Vocabulary", "entry_ids"]


class Vocabulary(Protocol):
    """What recovering ids needs of a model's tokenizer."""

    def token_bytes(self, token: int) -> bytes:
        """The bytes ``token`` stands for (b"" when unknown)."""
        ...

    def split_bytes(self, data: bytes) -> list[int]:
        """``data`` (maybe not valid UTF-8 on its own) as the tokenizer's BPE splits it."""
        ...

    def encode_text(self, text: str) -> list[int]:
        """Sampled text back to ids (special tokens matched whole)."""
        ...


@dataclass(slots=True)
class IdCounts:
    """Ids the route had to work out itself, over one segment."""

    recovered: int = 0
    retokenized: int = 0


class TiktokenVocabulary:
    """The o200k vocabulary of the ``generic`` and ``harmony`` formats."""

    def __init__(self, encoding: tiktoken.Encoding) -> None:
        self._encoding = encoding

    def token_bytes(self, token: int) -> bytes:
        try:
            return bytes(self._encoding.decode_single_token_bytes(token))
        except (KeyError, ValueError):
            return b""

    def split_bytes(self, data: bytes) -> list[int]:
        encode_bytes = getattr(self._encoding, "_encode_bytes", None)
        if encode_bytes is not None:  # tiktoken's BPE over raw bytes (not public API)
            return list(encode_bytes(data))
        return [self._encoding.encode_single_token(bytes([b])) for b in data]

    def encode_text(self, text: str) -> list[int]:
        return list(self._encoding.encode(text, allowed_special="all"))


def entry_ids(
    entries: list[JSONValue], vocabulary: Vocabulary | None, counts: IdCounts
) -> list[JSONValue]:
    """The ids of llama.cpp-style ``logprobs.content`` entries, with the ids of tokens that
    got no entry of their own put back before the entry whose bytes carry them."""
    ids: list[JSONValue] = []
    for entry in entries:
        if not isinstance(entry, dict):
            ids.append(None)
            continue
        token = entry.get("id")
        ids += _missing(entry, token, vocabulary, counts)
        ids.append(token)
    return ids


def _missing(
    entry: JSONObject, token: JSONValue, vocabulary: Vocabulary | None, counts: IdCounts
) -> list[JSONValue]:
    if vocabulary is None or not isinstance(token, int) or isinstance(token, bool):
        return []
    reported = _reported_bytes(entry)
    own = vocabulary.token_bytes(token)
    # A special token reports no bytes (or its text): nothing precedes it.
    if reported is None or not own or len(reported) <= len(own) or not reported.endswith(own):
        return []
    missing = vocabulary.split_bytes(reported[: -len(own)])
    counts.recovered += len(missing)
    return list(missing)


def _reported_bytes(entry: JSONObject) -> bytes | None:
    raw = entry.get("bytes")
    if isinstance(raw, list):
        if all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b < 256 for b in raw):
            return bytes(b for b in raw if isinstance(b, int))
        return None
    text = entry.get("token")  # older llama.cpp: the text only, valid UTF-8 by construction
    return text.encode() if isinstance(text, str) else None
