"""Figures from raw cells: tables for the terminal, JSON, CSV, PNG plots and a Markdown draft.

Conventions, so every number means one thing:

* *Per-turn* figures (overhead, TTFT, turn time) are medians and p99 over every measured turn
  of every repeat; *spread* is the range of the per-repeat medians.
* *End-to-end* is one rollout, first request to final answer; the table gives the median over
  repeats and the min-max range.
* *API overhead* of a turn is the client-observed turn time minus the engine time the server
  reports for that turn (``response.stats.engine_ms``); the *API share* is total overhead over
  total turn time.
* *Server CPU per turn* is the server process's CPU time (all threads, ``cpu.py``) used per
  turn: read by the client at every turn boundary when one agent runs (setup turns
  excluded), else the run's total over its turns. It includes the simulated engine's own
  work (pacing, hashing the prompt for its prefix cache), identical in every mode.
  *Client CPU* is the same for the client process (its share of the two cores matters).
* *Bytes* are TCP payload bytes on the client's sockets (``wire.py``): request direction
  ("up") and response direction ("down"), per turn.
* *Steering* figures are milliseconds from the steer's send (5 ms after its target's create)
  to its acknowledgement and to the automatic successor's first text delta, p50 and p10-p90
  over every round of every repeat.

The package, one job per module: ``summaries`` (cells to per-mode figures), ``targets`` (the
verdicts), ``network`` (the projection on paper), ``tables`` (text tables, one per kind of
cell), ``network_tables`` (the network's), ``table_cells`` (the table type and its cell
formats), ``assembly`` (the ``Report``), ``plots`` (PNG), ``files`` (every output file),
``document`` (docs/results.md: ``results_template.md`` filled in with the run's figures) and
``machine`` (what the run was measured on).
"""

from __future__ import annotations

from ..stats import percentile
from .assembly import Report, build_report
from .document import render_document, write_document
from .files import write_outputs
from .machine import machine_info
from .network import NETWORK_PROFILES, network_projection
from .plots import write_plots
from .summaries import summarize
from .targets import evaluate_targets

__all__ = [
    "NETWORK_PROFILES",
    "Report",
    "build_report",
    "evaluate_targets",
    "machine_info",
    "network_projection",
    "percentile",
    "render_document",
    "summarize",
    "write_document",
    "write_outputs",
    "write_plots",
]
