"""Compaction tokens: sealed, opaque, unforgeable; the key file is created once and kept."""

from __future__ import annotations

import base64
import stat
import zlib
from pathlib import Path

import orjson
import pytest
from bidi_responses.server.core.api.errors import ApiError
from bidi_responses.server.core.runs.compaction import CompactionCodec, load_key

CODEC = CompactionCodec(b"test-key-0123456789abcdef")


def test_a_sealed_token_opens_to_its_payload() -> None:
    token = CODEC.seal({"summary": "ran ls", "items": 3})
    assert CODEC.open(token) == {"summary": "ran ls", "items": 3}
    assert "ran ls" not in token  # compressed and encoded: not readable as is


@pytest.mark.parametrize("position", [0, 5, 40, -1])
def test_any_altered_character_is_refused(position: int) -> None:
    token = CODEC.seal({"summary": "ran ls"})
    chars = list(token)
    chars[position] = "A" if chars[position] != "A" else "B"
    with pytest.raises(ValueError):
        CODEC.open("".join(chars))


def test_a_token_from_another_key_is_refused() -> None:
    token = CompactionCodec(b"some-other-key-0123456789").seal({"summary": "x"})
    with pytest.raises(ValueError, match="not issued by this server"):
        CODEC.open(token)


def test_a_client_cannot_forge_a_token_by_mimicking_the_format() -> None:
    body = bytes([1]) + zlib.compress(orjson.dumps({"summary": "I am admin"}))
    forged = base64.urlsafe_b64encode(b"\x00" * 32 + body).decode()
    with pytest.raises(ValueError):
        CODEC.open(forged)
    with pytest.raises(ValueError):
        CODEC.open("not base64 at all!")


def test_check_names_the_item_and_field() -> None:
    with pytest.raises(ApiError) as caught:
        CODEC.check({"type": "compaction", "encrypted_content": "xyz"}, "input[2]")
    assert caught.value.param == "input[2].encrypted_content"
    assert caught.value.code == "invalid_encrypted_content"
    assert caught.value.status == 400


def test_summary_lines_are_bounded_and_name_the_tools() -> None:
    codec = CompactionCodec(b"test-key-0123456789abcdef", summary_item_chars=40)
    summary = codec.summarize(
        [
            {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "x" * 500},
            {"type": "compaction", "encrypted_content": codec.seal({"summary": "earlier work"})},
        ]
    )
    lines = summary.split("\n")
    assert lines[0] == "called ls({})"
    assert lines[1].startswith("ls returned: ") and len(lines[1]) == 40
    assert lines[2] == "earlier work"


def test_key_file_is_created_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "compaction.key"
    key = load_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_key(path) == key
    token = CompactionCodec(key).seal({"summary": "kept across restarts"})
    assert CompactionCodec(load_key(path)).open(token)["summary"] == "kept across restarts"


def test_a_short_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "k"
    path.write_text("short")
    with pytest.raises(ValueError, match="shorter than 16 bytes"):
        load_key(path)


def _load_key_hex(path: str) -> str:
    return load_key(Path(path)).hex()


def test_workers_starting_together_share_one_whole_key(tmp_path: Path) -> None:
    # Processes racing to create the key must all read the same, complete key.
    from concurrent.futures import ProcessPoolExecutor

    path = tmp_path / "race" / "compaction.key"
    with ProcessPoolExecutor(max_workers=4) as pool:
        keys = list(pool.map(_load_key_hex, [str(path)] * 16, timeout=60))
    assert len(set(keys)) == 1
    assert bytes.fromhex(keys[0]) == path.read_bytes().strip()
    assert [p.name for p in path.parent.iterdir()] == ["compaction.key"]
