"""The report on disk: results.json, the CSV files, report.md, report.txt and the plots."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, is_dataclass
from pathlib import Path

from .assembly import Report
from .plots import write_plots
from .records import JSONObject, JSONValue

__all__ = ["write_outputs"]


def write_outputs(report: Report, out_dir: Path, *, plots: bool = True) -> dict[str, Path]:
    """results.json, turns.csv, runs.csv, summary.csv, report.md, report.txt and PNG plots."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    paths["json"] = out_dir / "results.json"
    paths["json"].write_text(
        json.dumps(report.to_json(), indent=1, default=_json_default), encoding="utf-8"
    )
    paths["turns_csv"] = out_dir / "turns.csv"
    _write_csv(paths["turns_csv"], [dict(t, cell=c.name) for c in report.cells for t in c.turns])
    paths["runs_csv"] = out_dir / "runs.csv"
    _write_csv(
        paths["runs_csv"],
        [
            {
                **{k: v for k, v in r.items() if not isinstance(v, list)},
                "e2e_s": ";".join(f"{x:.4f}" for x in r.get("e2e_s", [])),
                "cell": c.name,
            }
            for c in report.cells
            for r in c.runs
        ],
    )
    paths["summary_csv"] = out_dir / "summary.csv"
    _write_csv(
        paths["summary_csv"],
        [
            {"cell": s["name"], **{k: v for k, v in row.items() if not isinstance(v, list)}}
            for s in report.summaries
            for row in s["rows"]
        ],
    )
    paths["markdown"] = out_dir / "report.md"
    paths["markdown"].write_text(report.markdown(), encoding="utf-8")
    paths["text"] = out_dir / "report.txt"
    paths["text"].write_text(report.text() + "\n", encoding="utf-8")
    if plots:
        paths.update(write_plots(report, out_dir))
    return paths


def _json_default(value: object) -> JSONValue:
    if isinstance(value, Path):
        return str(value)
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _flat(row: JSONObject) -> JSONObject:
    out: JSONObject = {}
    for key, value in row.items():
        if isinstance(value, dict):
            for sub, inner in value.items():
                out[f"{key}.{sub}"] = inner
        else:
            out[key] = value
    return out


def _write_csv(path: Path, rows: list[JSONObject]) -> None:
    # Nested dicts (per-stage times) become one column per key.
    rows = [_flat(row) for row in rows]
    columns: list[str] = []
    for row in rows:
        for key in row:
            if key not in columns:
                columns.append(key)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
