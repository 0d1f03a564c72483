"""Identifiers in the Responses style: a type prefix and 32 random hex digits."""

from __future__ import annotations

import os


def new_id(prefix: str) -> str:
    """A fresh id such as ``resp_9f2c...``; ``prefix`` is ``resp``, ``msg``, ``fc``, ``call``..."""
    return f"{prefix}_{os.urandom(16).hex()}"
