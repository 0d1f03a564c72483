"""The codec benchmarks' summary: each pair's medians and their ratio, after the run."""

from __future__ import annotations

import pytest

from tests.codec import test_codec_bench


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = test_codec_bench.ratio_lines()
    if lines:
        terminalreporter.section("codec against orjson (medians)")
        for line in lines:
            terminalreporter.write_line(line)
