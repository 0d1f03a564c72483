"""Transports: each translates its framing to and from the core's JSON-shaped events."""
