"""Tests of the tokenizer and the simulated inference engines."""
