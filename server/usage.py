"""``bidi-responses usage``: a summary of the usage ledger."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from bidi_responses.server.core.store import read_ledger


def summarize(data_dir: str | Path, by: str = "tenant") -> list[dict[str, Any]]:
    """Ledger totals grouped by ``by`` (tenant, model, transport or status)."""
    path = Path(data_dir) / "responses.db"
    if not path.exists():
        raise FileNotFoundError(f"no ledger at {path}: has a server run with --data-dir {data_dir}?")
    groups: dict[str, dict[str, Any]] = defaultdict(lambda: {
        "responses": 0, "input_tokens": 0, "cached_tokens": 0, "output_tokens": 0,
        "engine_ms": 0.0, "api_ms": 0.0,
    })
    for row in read_ledger(path):
        group = groups[str(getattr(row, by))]
        group["responses"] += 1
        group["input_tokens"] += row.input_tokens
        group["cached_tokens"] += row.cached_tokens
        group["output_tokens"] += row.output_tokens
        group["engine_ms"] += row.engine_ms
        group["api_ms"] += row.api_pre_ms + row.api_post_ms
    return [{by: key, **values} for key, values in sorted(groups.items())]


def print_usage(data_dir: str | Path, *, by: str = "tenant", as_json: bool = False) -> int:
    """Print the summary; returns the process exit code."""
    try:
        rows = summarize(data_dir, by)
    except FileNotFoundError as error:
        print(f"error: {error}")
        return 1
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    header = f"{by:<24} {'responses':>9} {'input':>12} {'cached':>12} {'output':>10} " \
             f"{'engine s':>9} {'api s':>8}"
    print(header)
    print("-" * len(header))
    for row in rows:
        print(f"{row[by]:<24} {row['responses']:>9} {row['input_tokens']:>12} "
              f"{row['cached_tokens']:>12} {row['output_tokens']:>10} "
              f"{row['engine_ms'] / 1000:>9.2f} {row['api_ms'] / 1000:>8.3f}")
    return 0
