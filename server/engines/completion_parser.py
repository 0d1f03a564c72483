"""Parsing what a model samples in the project's chat format back into output items.

The renderer (``core.rendering.render``) writes the conversation in a harmony-style format and the
engine
ends the prompt with ``<|start|>assistant``. What the model samples next is the rest of one or
more assistant messages::

    <|channel|>final<|message|>{text}<|return|>                  an answer (or ...<|end|>)
    <|channel|>analysis<|message|>{thinking}<|end|><|start|>assistant...   reasoning, then more
    to=functions.{name}<|channel|>commentary json<|message|>{arguments}<|call|>   a tool call

``CompletionParser`` is fed the sampled token ids one by one, as they stream in, and returns
the engine events (item start, text deltas, item end) they complete. It stops at ``<|call|>``,
``<|return|>`` or the ``<|end|>`` of a final answer (``finished``). ``analysis`` messages
become reasoning items. A model that breaks the format (no header within ``max_header_tokens``, or
a stream that ends inside a header) is not an error: what it wrote becomes a plain message, as
the OpenAI-compatible servers do when their output parser cannot make sense of a completion.
"""

from __future__ import annotations

import codecs
import re

import tiktoken

from ..core.ports import (
    CALL,
    CHANNEL,
    CONSTRAIN,
    END,
    MESSAGE,
    RETURN,
    START,
    Delta,
    EngineEvent,
    ItemEnd,
    ItemStart,
)

_RECIPIENT = re.compile(r"to=([^\s<]+)")
# Tokens that end the model's turn: stop sampling after them.
STOP_TOKENS: tuple[int, ...] = (RETURN, CALL)


class CompletionParser:
    """Incremental parser for one sampling segment (see the module docstring)."""

    def __init__(self, encoding: tiktoken.Encoding, *, max_header_tokens: int = 64) -> None:
        self._token_bytes = encoding.decode_single_token_bytes
        self._max_header = max_header_tokens
        self._state = "header"  # header | content | between | done
        self._header: list[int] = []
        self._kind: str | None = None  # message | function_call | reasoning
        self._final = False
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending_ids: list[int] = []
        self.finished = False
        self.items = 0
        self.last_kind: str | None = None
        self.unknown_tokens = 0

    # -- public ------------------------------------------------------------------------------

    def feed(self, token: int) -> list[EngineEvent]:
        """Consume one sampled token; return the events it completes."""
        state = self._state
        if state == "done":
            return []
        if state == "header":
            return self._feed_header(token)
        if state == "content":
            return self._feed_content(token)
        # between messages: only <|start|> opens the next one; anything else is skipped.
        if token == START:
            self._state = "header"
            self._header = []
        elif token in STOP_TOKENS:
            self._done()
        return []

    def close(self) -> list[EngineEvent]:
        """The stream ended: close an open item (truncated) or salvage a broken header."""
        events: list[EngineEvent] = []
        if self._state == "content":
            events += self._end_item()
        elif self._state == "header" and self._header:
            text = self._header_text()
            if text.strip():
                events += self._raw_message(text)
                events += self._end_item()
        self._state = "done"
        return events

    # -- states ------------------------------------------------------------------------------

    def _feed_header(self, token: int) -> list[EngineEvent]:
        if token == MESSAGE:
            return self._open_item()
        if token in (RETURN, CALL, END):
            # A turn that ends inside its header: salvage any text, then stop.
            events = self.close()
            self._done()
            return events
        if token == START:
            self._header = []  # a fresh header; what came before carried no message
            return []
        self._header.append(token)
        if len(self._header) > self._max_header:
            events = self._raw_message(self._header_text())
            return events
        return []

    def _feed_content(self, token: int) -> list[EngineEvent]:
        if token in (END, RETURN, CALL):
            events = self._end_item(token)
            if token != END or self._final:
                self._done()
            else:
                self._state = "between"
            return events
        if token in (START, CHANNEL, MESSAGE):
            return []  # structure tokens cannot appear inside a message body; drop them
        return self._text(token)

    # -- helpers -----------------------------------------------------------------------------

    def _header_text(self) -> str:
        parts: list[bytes] = []
        for token in self._header:
            if token == CHANNEL:
                parts.append(b"<|channel|>")
            elif token == CONSTRAIN:
                parts.append(b"<|constrain|>")
            else:
                parts.append(self._bytes(token))
        return b"".join(parts).decode("utf-8", "replace")

    def _open_item(self) -> list[EngineEvent]:
        header = self._header_text()
        self._header = []
        channel = header.split("<|channel|>", 1)[1] if "<|channel|>" in header else ""
        recipient = _RECIPIENT.search(header)
        self._state = "content"
        self._decoder.reset()
        self._pending_ids = []
        self._final = False
        if recipient is not None and recipient.group(1).startswith("functions."):
            self._kind = "function_call"
            name = recipient.group(1)[len("functions.") :]
            return [ItemStart("function_call", name=name)]
        if channel.startswith("analysis"):
            self._kind = "reasoning"
            return [ItemStart("reasoning")]
        self._kind = "message"
        self._final = channel.startswith("final") or not channel
        return [ItemStart("message")]

    def _raw_message(self, text: str) -> list[EngineEvent]:
        ids = tuple(self._header)
        self._header = []
        self._state = "content"
        self._kind = "message"
        self._final = True
        self._decoder.reset()
        self._pending_ids = []
        return [ItemStart("message"), Delta(text, ids)]

    def _text(self, token: int) -> list[EngineEvent]:
        self._pending_ids.append(token)
        text = self._decoder.decode(self._bytes(token))
        if not text:
            return []
        ids = tuple(self._pending_ids)
        self._pending_ids = []
        return [Delta(text, ids)]

    def _end_item(self, token: int | None = None) -> list[EngineEvent]:
        kind = self._kind
        self._kind = None
        if kind is None:
            return []
        events: list[EngineEvent] = []
        tail = self._decoder.decode(b"", final=True)
        if tail:
            events.append(Delta(tail, tuple(self._pending_ids)))
        self._pending_ids = []
        events.append(ItemEnd())
        self.items += 1
        self.last_kind = kind
        return events

    def _done(self) -> None:
        self._state = "done"
        self.finished = True

    def _bytes(self, token: int) -> bytes:
        try:
            return bytes(self._token_bytes(token))
        except (KeyError, ValueError):
            self.unknown_tokens += 1  # an id outside the encoding (a reserved token)
            return b""
