"""What the encoder keeps between events holds only its own bytes.

``orjson.dumps`` returns bytes inside a buffer of at least 4 KiB; a per-stream cache keyed by
its results kept that buffer per entry (about 16 KiB per open stream after one turn).
"""

from __future__ import annotations

import gc
import tracemalloc

import orjson
from bidi_responses.codec import ProtoEncoder
from bidi_responses.codec.wire import exact

from tests.codec.test_codec_bench import TURNS


def _retained(build: object) -> int:
    """Bytes still traced after ``build()`` ran and its result is kept."""
    assert callable(build)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = build()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del kept
    return after - before


def test_an_exact_copy_holds_only_its_own_bytes() -> None:
    values = [{"type": "message", "id": f"msg_{n}", "text": "hi"} for n in range(200)]
    raw = _retained(lambda: [orjson.dumps(v) for v in values])
    copied = _retained(lambda: [exact(orjson.dumps(v)) for v in values])
    assert copied < 200 * 256 < raw  # each result is under 100 bytes of JSON
    assert all(exact(orjson.dumps(v)) == orjson.dumps(v) for v in values)


def test_an_encoder_keeps_little_after_four_turns() -> None:
    def encode() -> ProtoEncoder:
        encoder = ProtoEncoder()
        for turn in TURNS[:4]:
            for event in turn:
                encoder.event_bytes("lane", event)
        return encoder

    encode()  # module-level tables and interned values first
    # Measured: ~18 KiB (its remembered items, stats, heads and echo); ~48 KiB when its cache
    # keys were orjson's own results.
    assert _retained(encode) < 32 * 1024
