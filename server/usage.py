"""``bidi-responses usage``: a summary of the usage ledger.

The ledger has one row per finished response (completed, incomplete, failed, or cancelled when
its stream was cut short), written off the critical path. This command reads the SQLite file
directly, read-only, so it works while the server runs; with ``--store-url`` it reads a shared
PostgreSQL store's ledger (every replica's rows).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict

from .core.storage.backend import is_postgres_url
from .core.storage.sqlite_schema import read_ledger
from .core.storage.store import LedgerRow

GroupKey = Literal["tenant", "model", "transport", "status"]
GROUP_KEYS: tuple[GroupKey, ...] = ("tenant", "model", "transport", "status")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(value: str, now: float | None = None) -> int:
    """A start time: a duration back from now (``90s``, ``15m``, ``2h``, ``7d``) or a unix
    timestamp."""
    now = time.time() if now is None else now
    match = _DURATION.match(value.strip())
    if match:
        return int(now - float(match.group(1)) * _UNITS[match.group(2)])
    try:
        return int(float(value))
    except ValueError:
        raise ValueError(
            f"invalid --since '{value}': use a duration such as 15m, 2h or 7d, or a unix time"
        ) from None


class UsageGroup(TypedDict, total=False):
    """One line of the summary: the group's keys, then its totals."""

    tenant: str
    model: str
    transport: str
    status: str
    responses: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    engine_ms: float
    api_ms: float
    cached_share: float


def _group_keys(by: str | Sequence[str]) -> list[GroupKey]:
    keys = [k.strip() for k in by.split(",")] if isinstance(by, str) else list(by)
    known: dict[str, GroupKey] = {key: key for key in GROUP_KEYS}
    for key in keys:
        if key not in known:
            raise ValueError(f"cannot group by '{key}' (choose from {', '.join(GROUP_KEYS)})")
    return [known[key] for key in keys]


@dataclass(slots=True)
class _Sums:
    """Running totals of a group of ledger rows (or of summary lines)."""

    responses: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    engine_ms: float = 0.0
    api_ms: float = 0.0

    def add_row(self, row: LedgerRow) -> None:
        self.responses += 1
        self.input_tokens += row.input_tokens
        self.cached_tokens += row.cached_tokens
        self.output_tokens += row.output_tokens
        self.engine_ms += row.engine_ms
        self.api_ms += row.api_pre_ms + row.api_post_ms

    def add_group(self, group: UsageGroup) -> None:
        self.responses += group["responses"]
        self.input_tokens += group["input_tokens"]
        self.cached_tokens += group["cached_tokens"]
        self.output_tokens += group["output_tokens"]
        self.engine_ms += group["engine_ms"]
        self.api_ms += group["api_ms"]

    def finish(self) -> UsageGroup:
        inputs = self.input_tokens
        return {
            "responses": self.responses,
            "input_tokens": self.input_tokens,
            "cached_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens,
            "engine_ms": round(self.engine_ms, 3),
            "api_ms": round(self.api_ms, 3),
            "cached_share": round(self.cached_tokens / inputs, 4) if inputs else 0.0,
        }


async def _shared_rows(url: str) -> list[LedgerRow]:
    from .core.storage.pg_store import PostgresStore

    store = PostgresStore(url, pool_size=1)
    await store.open()
    try:
        return await store.ledger_rows()
    finally:
        await store.aclose()


def load_rows(data_dir: str | Path, since: int | None = None) -> list[LedgerRow]:
    """The ledger rows of ``data_dir``, or of a shared store when it is a ``postgresql://``
    URL (created at or after ``since``)."""
    if isinstance(data_dir, str) and is_postgres_url(data_dir):
        rows = asyncio.run(_shared_rows(data_dir))
    else:
        path = Path(data_dir) / "responses.db"
        if not path.exists():
            raise FileNotFoundError(
                f"no ledger at {path}: has a server run with --data-dir {data_dir}?"
            )
        rows = read_ledger(path)
    if since is not None:
        rows = [row for row in rows if row.created_at >= since]
    return rows


def summarize(
    data_dir: str | Path, by: str | Sequence[str] = "tenant", *, since: int | None = None
) -> list[UsageGroup]:
    """Ledger totals grouped by ``by`` (tenant, model, transport, status, or several joined
    by commas), sorted by group."""
    keys = _group_keys(by)
    groups: dict[tuple[str, ...], _Sums] = defaultdict(_Sums)
    for row in load_rows(data_dir, since):
        groups[tuple(str(getattr(row, key)) for key in keys)].add_row(row)
    summary: list[UsageGroup] = []
    for group, sums in sorted(groups.items(), key=lambda entry: entry[0]):
        line: UsageGroup = {}
        for key, value in zip(keys, group, strict=True):
            line[key] = value
        line.update(sums.finish())
        summary.append(line)
    return summary


def totals(rows: list[UsageGroup]) -> UsageGroup:
    """The sum of summary rows."""
    total = _Sums()
    for row in rows:
        total.add_group(row)
    return total.finish()


def print_usage(
    data_dir: str | Path,
    *,
    by: str | Sequence[str] = "tenant",
    as_json: bool = False,
    since: str | None = None,
) -> int:
    """Print the summary; returns the process exit code."""
    try:
        keys = _group_keys(by)
        start = parse_since(since) if since else None
        rows = summarize(data_dir, keys, since=start)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}")
        return 1
    if as_json:
        print(json.dumps({"groups": rows, "total": totals(rows)}, indent=2))
        return 0
    label = "/".join(keys)
    width = max([len(label), 8, *(len("/".join(str(r[k]) for k in keys)) for r in rows)])
    header = (
        f"{label:<{width}} {'responses':>9} {'input':>12} {'cached':>12} {'cached%':>7} "
        f"{'output':>10} {'engine s':>9} {'api s':>8}"
    )
    print(header)
    print("-" * len(header))
    total_row: UsageGroup = {}
    for key in keys:
        total_row[key] = ""
    total_row.update(totals(rows))
    for row in [*rows, total_row]:
        name = "total" if row is total_row else "/".join(str(row[k]) for k in keys)
        print(
            f"{name:<{width}} {row['responses']:>9} {row['input_tokens']:>12} "
            f"{row['cached_tokens']:>12} {row['cached_share'] * 100:>6.1f}% "
            f"{row['output_tokens']:>10} {row['engine_ms'] / 1000:>9.2f} "
            f"{row['api_ms'] / 1000:>8.3f}"
        )
    return 0
