"""Deterministic test payloads: tool outputs that look like code and logs."""

from __future__ import annotations

import random

from bidi_responses.server.core.rendering.tokenizer import load_encoding

_LINES = [
    "def handle_request(self, request):\n    return self.router.dispatch(request)\n",
    "2026-11-29T09:43:37Z INFO worker-3 processed batch id=%d in %d ms\n",
    'Traceback (most recent call last):\n  File "app.py", line %d, in <module>\n',
    "ERROR connection reset by peer (errno=104) after %d retries\n",
    "for (let i = 0; i < items.length; i++) { total += items[i].price * %d; }\n",
    '    assert response.status_code == 200, f"unexpected {response.status_code}"\n',
    "-rw-r--r-- 1 dev dev %d Nov 29 09:43 src/module_%d.py\n",
    "WARNING: retrying request to /v1/items/%d (attempt %d)\n",
]


def tool_output(tokens: int, seed: int) -> str:
    """Text of about ``tokens`` o200k tokens, different for each seed."""
    rng = random.Random(seed)
    encoding = load_encoding()
    parts: list[str] = []
    count = 0
    while count < tokens:
        line = rng.choice(_LINES)
        line = line.replace("%d", str(rng.randint(1, 99999)))
        parts.append(line)
        count += len(encoding.encode_ordinary(line))
    return "".join(parts)
