"""Benchmarks: ``bidi-responses compare`` and the focused micro-benchmarks."""
