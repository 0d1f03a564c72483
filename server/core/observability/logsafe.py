"""Client strings in log lines, escaped so a client can never forge a line.

A newline in a client-set field (``user``, a model name, an id) would otherwise start a new
log line that looks like the server's own, say an ``ERROR``. Control characters are escaped
the way Python writes them in a string literal, and long values are cut.
"""

from __future__ import annotations

import logging

_LIMIT = 200


def printable(value: object, limit: int = _LIMIT) -> str:
    """``value`` as one line of printable text, at most ``limit`` characters (plus a mark)."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        text = text[:limit] + f"...(+{len(text) - limit} chars)"
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in text)


class EscapingFormatter(logging.Formatter):
    """Escapes control characters in the message of every record (a traceback keeps its lines).

    A second line of defence for call sites that log a value without ``printable``.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message, limit=10_000)
        return super().formatMessage(record)
