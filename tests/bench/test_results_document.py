"""The results document's template: every placeholder it uses is defined, and a typo fails."""

from __future__ import annotations

import argparse
import re

import pytest
from bidi_responses.bench.cli import add_compare
from bidi_responses.bench.compare_args import config_from_args
from bidi_responses.bench.report import Report, build_report, render_document
from bidi_responses.bench.report.document import PLACEHOLDER, SECTIONS


def _empty_report() -> Report:
    parser = argparse.ArgumentParser()
    add_compare(parser.add_subparsers())
    config = config_from_args(parser.parse_args(["compare"]))
    return build_report([], config, {"command": "bidi-responses compare"})


def test_a_run_without_data_still_renders_every_section() -> None:
    text = render_document(_empty_report())
    assert not PLACEHOLDER.search(text)
    for section in SECTIONS:
        assert f"\n## {section}\n" in text, section
    assert "n/a" in text


def test_an_unknown_placeholder_is_an_error() -> None:
    with pytest.raises(ValueError, match=re.escape("h.grpc_conect.cpu")):
        render_document(_empty_report(), template="CPU {{h.grpc_conect.cpu}}")


def test_aiperf_figures_sit_beside_the_projects_own() -> None:
    aiperf = {
        "workload": "80 requests",
        "command": "aiperf profile ...",
        "rows": [{"figure": "time to first token, ms", "aiperf": "59.5", "own": "57.0"}],
    }
    text = render_document(_empty_report(), aiperf, template="{{aiperf}}")
    assert "| time to first token, ms | 59.5 | 57.0 |" in text
    failed = render_document(_empty_report(), {"error": "aiperf exited 1"}, template="{{aiperf}}")
    assert "aiperf exited 1" in failed
