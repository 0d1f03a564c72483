"""The report of one run: summaries, targets and metadata, rendered as text, Markdown, JSON."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

from ..run import CellResult, CompareConfig
from .records import JSONObject
from .summaries import summarize
from .table_cells import Table, aligned
from .tables import summary_tables
from .targets import evaluate_targets

__all__ = ["Report", "build_report"]


class Report:
    """Summaries, targets and metadata of one run, with renderers."""

    def __init__(
        self, cells: Sequence[CellResult], config: CompareConfig, meta: JSONObject
    ) -> None:
        self.cells = list(cells)
        self.config = config
        self.meta = meta
        self.summaries = summarize(self.cells)
        self.targets = evaluate_targets(self.summaries)

    def tables(self) -> list[Table]:
        """(title, header, rows) for every table, as text."""
        return summary_tables(self.summaries)

    def text(self) -> str:
        """Every table and the targets, aligned for a terminal."""
        parts = []
        for title, header, rows in self.tables():
            parts.append(title)
            parts.append(aligned(header, rows))
            parts.append("")
        parts.append("Targets")
        for t in self.targets:
            mark = "MET   " if t["met"] else "MISSED" if t["met"] is False else "n/a   "
            parts.append(f"  [{mark}] {t['id']}: {t['target']} -- {t['detail']}")
        return "\n".join(parts)

    def markdown(self) -> str:
        """The tables and targets as Markdown (a draft for docs/results.md)."""
        lines = [f"Command: `{self.meta.get('command', '')}`", ""]
        machine = self.meta.get("machine", {})
        lines.append(
            f"Machine: {machine.get('nproc')} vCPU, {machine.get('cpu_model')}, "
            f"Python {machine.get('python')}; "
            + ", ".join(f"{k} {v}" for k, v in (machine.get("versions") or {}).items() if v)
        )
        lines.append(f"Allocator: {self.meta.get('allocator')}")
        lines.append("")
        for title, header, rows in self.tables():
            lines.append(f"### {title}")
            lines.append("")
            lines.append("| " + " | ".join(header) + " |")
            lines.append("|" + "|".join("---" for _ in header) + "|")
            lines.extend("| " + " | ".join(row) + " |" for row in rows)
            lines.append("")
        lines.append("### Targets")
        lines.append("")
        for t in self.targets:
            mark = "met" if t["met"] else "**missed**" if t["met"] is False else "n/a"
            lines.append(f"- {t['id']} ({mark}): {t['target']}: {t['detail']}")
        return "\n".join(lines) + "\n"

    def to_json(self) -> JSONObject:
        """Everything: metadata, configuration, summaries, targets, and the raw cells."""
        config = asdict(self.config)
        config["out_dir"] = str(self.config.out_dir)
        for key, value in list(config.items()):
            if (
                isinstance(value, list)
                and value
                and isinstance(value[0], dict)
                and "key" in value[0]
            ):
                config[key] = [m["key"] for m in value]
            elif isinstance(value, dict) and "key" in value:
                config[key] = value["key"]
        return {
            "meta": self.meta,
            "config": config,
            "summaries": self.summaries,
            "targets": self.targets,
            "cells": [asdict(c) for c in self.cells],
        }


def build_report(cells: Sequence[CellResult], config: CompareConfig, meta: JSONObject) -> Report:
    """A Report over ``cells``."""
    return Report(cells, config, meta)
