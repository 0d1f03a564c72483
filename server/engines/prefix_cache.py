"""The simulated engines' own prefix (KV) cache: a bounded LRU set of chained block hashes.

It models what vLLM and SGLang call automatic prefix caching, so that a prompt which extends
one the engine saw before is charged prefill only for its new tokens (``timing.play`` asks it).
It belongs to the engine instance, shared by every stream and transport, and is bounded by
``max_blocks``.
"""

from __future__ import annotations

import array
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["PrefixCache"]

# An array typecode with 4-byte items, so that a list and an array('I') of the same ids hash
# to the same bytes. ('I' is 4 bytes on every platform CPython supports; 'L' is the fallback.)
_TYPECODE = next(code for code in ("I", "L") if array.array(code).itemsize == 4)


class PrefixCache:
    """A bounded LRU set of prompt blocks, identified by chained hashes (automatic prefix caching).

    A prompt is cut into whole blocks of ``block_tokens`` tokens. Block ``i`` is identified by
    a hash of its tokens chained with the hash of block ``i - 1``, so a block hits only when the
    entire prefix up to and including it was seen before, exactly like vLLM's block hashes.
    The partial block at the end of a prompt is never cached.

    At most ``max_blocks`` block hashes are remembered. Eviction is least-recently-used, and
    each prompt's blocks are refreshed from last to first, so that under pressure the *tails*
    of old prompts go first and the shared heads (instructions, tools) stay: evicting a head
    block would make every block chained after it unreachable.

    Hashing costs a few milliseconds for a 200k-token prompt; it is done on the caller's
    thread without awaiting, and a lock makes it safe to share across threads as well.
    """

    def __init__(self, block_tokens: int = 64, max_blocks: int = 65_536) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        if max_blocks < 0:
            raise ValueError(f"max_blocks must be >= 0, got {max_blocks}")
        self.block_tokens = block_tokens
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Number of blocks currently remembered."""
        return len(self._blocks)

    def clear(self) -> None:
        """Forget every block."""
        with self._lock:
            self._blocks.clear()

    def match_and_insert(self, prompt_tokens: Sequence[int]) -> int:
        """Return how many leading tokens of ``prompt_tokens`` are cached, then remember them.

        The count is always a multiple of ``block_tokens``. ``prompt_tokens`` may be any
        sequence of non-negative ids below 2**32; an ``array('I')`` is hashed without copying.
        """
        digests = self._block_digests(prompt_tokens)
        if not digests:
            return 0
        with self._lock:
            blocks = self._blocks
            matched = 0
            # Chained hashes: once one block misses, none after it can hit.
            for digest in digests:
                if digest not in blocks:
                    break
                matched += 1
            # Refresh last-to-first so the prompt's first block ends up most recently used.
            for digest in reversed(digests):
                if digest in blocks:
                    blocks.move_to_end(digest)
                else:
                    blocks[digest] = None
            while len(blocks) > self.max_blocks:
                blocks.popitem(last=False)
        return matched * self.block_tokens

    def _block_digests(self, prompt_tokens: Sequence[int]) -> list[bytes]:
        if isinstance(prompt_tokens, array.array) and prompt_tokens.typecode == _TYPECODE:
            ids = prompt_tokens
        else:
            ids = array.array(_TYPECODE, prompt_tokens)
        raw = memoryview(ids).cast("B")
        step = self.block_tokens * ids.itemsize
        digests: list[bytes] = []
        previous = b""
        blake2b = hashlib.blake2b
        for start in range(0, len(raw) - step + 1, step):
            h = blake2b(previous, digest_size=16)
            h.update(raw[start : start + step])
            previous = h.digest()
            digests.append(previous)
        return digests
