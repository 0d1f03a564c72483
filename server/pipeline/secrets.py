"""Secrets classifier: credentials in the new input, by pattern and by entropy.

It looks at the text of each new item (message text, function call arguments, tool output;
see ``iter_texts``) for well-known credential formats (cloud keys, API tokens, private keys,
JWTs, credentials in URLs, ``password = "..."`` assignments) and for long random-looking
tokens (Shannon entropy). A hit is a ``secret_detected`` flag on the response, naming the
item's JSON path and the kind of credential, never the value; with ``block=True`` it is a 400
``secret_detected`` error instead.

Carried state (per conversation, across turns): keyed fingerprints of the secrets already
reported, so a secret that comes back in a later tool output is reported once per
conversation (or, with ``report_repeats=True``, again but marked as a repeat), and counts.
The fingerprints are HMACs under a per-process random key, truncated to 8 bytes: compact, and
useless for recovering a secret.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from ..core.ports import ApiError, CarriedState, Flag, StageInput, iter_texts
from .base import examine_off_loop, register_stage, text_windows

CODE = "secret_detected"
_KEY = os.urandom(32)


@dataclass(frozen=True, slots=True)
class SecretPattern:
    """One credential format.

    Every regex starts with a literal, so that the regex engine skips to candidates at the
    speed of a substring search; the word boundary before the match is checked by hand
    (a leading ``\b`` would make the engine try every position). ``mixed`` also requires
    upper case, lower case and digits in the value: a random key, not a hyphenated name.
    """

    kind: str
    regex: re.Pattern[str]
    group: int = 0
    mixed: bool = False
    boundary: bool = True


def _p(
    kind: str, pattern: str, *, group: int = 0, mixed: bool = False, boundary: bool = True
) -> SecretPattern:
    return SecretPattern(kind, re.compile(pattern), group, mixed, boundary)


def _mixed(value: str) -> bool:
    return (
        any(c.isupper() for c in value)
        and any(c.islower() for c in value)
        and any(c.isdigit() for c in value)
    )


PATTERNS: tuple[SecretPattern, ...] = (
    _p("AWS access key id", r"(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}(?![0-9A-Za-z])"),
    _p("GitHub token", r"gh[pousr]_[A-Za-z0-9]{36,255}(?![0-9A-Za-z])"),
    _p("GitHub fine-grained token", r"github_pat_[A-Za-z0-9_]{50,255}"),
    _p("OpenAI-style API key", r"sk-(?:[A-Za-z0-9]+-){0,2}[A-Za-z0-9_-]{20,}", mixed=True),
    _p("Stripe key", r"k_(?:live|test)_[0-9A-Za-z]{16,}", boundary=False),
    _p("Slack token", r"xox[abposre]-[A-Za-z0-9-]{10,}"),
    _p("Slack webhook", r"https://hooks\.slack\.com/services/[A-Za-z0-9/_-]{20,}"),
    _p("Google API key", r"AIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])", mixed=True),
    _p("private key", r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----", boundary=False),
    _p("JSON Web Token", r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    _p(
        "credentials in a URL",
        r"://[^\s:/@\"'<>]{1,64}:([^\s/@\"'<>]{6,128})@[\w.-]+",
        group=1,
        boundary=False,
    ),
)

# Matched on the ASCII-lowercased text (same length as the original, so spans carry over).
_AWS_SECRET = re.compile(
    r"aws_?(?:secret_?access_?key|secret_?key|secret)[\"']?\s*(?::|=|:=|=>)\s*[\"']?"
)
_AWS_SECRET_VALUE = re.compile(r"[A-Za-z0-9/+=]{40}(?![A-Za-z0-9/+=])")
# Where a ``name = value`` assignment may hide a credential: these words end the name.
_ANCHORS = ("pass", "pwd", "secret", "key", "token")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-.")
_NAME = re.compile(
    r"(?:pass(?:word|wd|phrase)?|pwd|secret|api[_-]?key|access[_-]?key|private[_-]?key|"
    r"secret[_-]?key|token)$"
)
_ASSIGNED = re.compile(
    r"[\"']?\s*(?::|=|:=|=>)\s*(?:(?P<q>[\"'])(?P<quoted>[^\"'\s]{8,200})(?P=q)"
    r"|(?P<bare>[^\s\"',;(){}\[\]<>]{12,200})(?![(\[]))"
)
_PLACEHOLDER = re.compile(
    r"(?i)^(?:\$\{?[\w.]+\}?|<[^>]*>|\{\{.*\}\}|%\(?\w+\)?s?|x{4,}|\*{3,}|\.{3,}|"
    r"(?:your|my|the|some|example|sample|dummy|fake|test|changeme|placeholder|redacted|none|null|"
    r"undefined|true|false|string|password|secret|token)[\w-]*)$"
)
# ``settings.database.password_field``: a dotted name in code, not a literal.
_IDENTIFIER = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
_WORDISH = re.compile(r"[a-z]{3,}")
_DIGIT = re.compile(r"[0-9]")
_SEPARATORS = re.compile(r"[_=.]")
# Runs of base64/base64url characters inside a long word: the entropy check's candidates.
_TOKEN = re.compile(r"[A-Za-z0-9+/_=-]{32,}")
_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_WORD = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


def shannon_entropy(text: str) -> float:
    """Bits per character of ``text`` (0 for an empty string)."""
    if not text:
        return 0.0
    length = len(text)
    return -sum(n / length * math.log2(n / length) for n in Counter(text).values())


def _fingerprint(value: str) -> bytes:
    return hmac.new(_KEY, value.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()[:8]


@dataclass(frozen=True, slots=True)
class Finding:
    """One credential-looking value (the value itself stays inside the classifier)."""

    kind: str
    fingerprint: bytes


class SecretsClassifier:
    """Flags (or blocks) credentials in new input items; see the module docstring.

    Settings (``[stage_settings.secrets]``):

    - ``block``: reject the request (400 ``secret_detected``) instead of flagging it.
    - ``entropy``: also report long random-looking tokens (default on).
    - ``min_entropy``: bits per character for that check (default 4.3).
    - ``min_token_length``/``max_token_length``: token lengths it considers (32 to 512).
    - ``report_repeats``: flag a secret again when it comes back in a later turn (marked as a
      repeat); by default each secret is reported once per conversation.
    - ``max_fingerprints``: how many reported secrets a conversation remembers (1024).
    """

    name = "secrets"

    def __init__(
        self,
        *,
        block: bool = False,
        entropy: bool = True,
        min_entropy: float = 4.3,
        min_token_length: int = 32,
        max_token_length: int = 512,
        report_repeats: bool = False,
        max_fingerprints: int = 1024,
        name: str = "secrets",
    ) -> None:
        if min_token_length < 8 or max_token_length < min_token_length:
            raise ValueError("need 8 <= min_token_length <= max_token_length")
        self.name = name
        self.block = block
        self.entropy = entropy
        self.min_entropy = min_entropy
        self.min_token_length = min_token_length
        self.max_token_length = max_token_length
        self.report_repeats = report_repeats
        self.max_fingerprints = max_fingerprints

    # -- detection ---------------------------------------------------------------------------

    def scan(self, text: str) -> list[Finding]:
        """Every credential-looking value in ``text``, deduplicated, in the order found.

        A long text is scanned in windows (``text_windows``); a value in two windows' overlap
        is one finding, as it is in one scan.
        """
        findings: dict[bytes, Finding] = {}
        values: list[str] = []
        for window in text_windows(text):
            self._scan_window(window, findings, values)
        return list(findings.values())

    def _scan_window(self, text: str, findings: dict[bytes, Finding], values: list[str]) -> None:
        """Add one window's findings (keyed by fingerprint) and values."""

        def add(kind: str, value: str) -> None:
            values.append(value)
            fp = _fingerprint(value)
            if fp not in findings:
                findings[fp] = Finding(kind, fp)

        for pattern in PATTERNS:
            for match in pattern.regex.finditer(text):
                start = match.start()
                if pattern.boundary and start and text[start - 1] in _WORD:
                    continue
                value = match.group(pattern.group)
                if not pattern.mixed or _mixed(value):
                    add(pattern.kind, value)
        lowered = text.translate(_LOWER)
        for match in _AWS_SECRET.finditer(lowered):
            found = _AWS_SECRET_VALUE.match(text, match.end())
            if found is not None:
                add("AWS secret access key", found.group())
        for value in self._assignments(text, lowered):
            if not any(value in other or other in value for other in values):
                add("credential assignment", value)
        if self.entropy:
            shortest = self.min_token_length
            for word in [w for w in text.split() if len(w) >= shortest]:
                for match in _TOKEN.finditer(word):
                    token = match.group().strip("=")
                    if not self.min_token_length <= len(token) <= self.max_token_length:
                        continue
                    if any(token in other or other in token for other in values):
                        continue
                    if _random_looking(token, self.min_entropy):
                        add("high-entropy string", token)

    @staticmethod
    def _assignments(text: str, lowered: str) -> Iterator[str]:
        """Values assigned to credential-named keys: ``password = "..."``, ``"api_key": ...``.

        Each occurrence of an anchor word is matched in place (back to the start of the name,
        forward through the value), so the cost follows the anchors, not the text length.
        """
        starts: set[int] = set()
        for anchor in _ANCHORS:
            index = lowered.find(anchor)
            while index >= 0:
                end = index + len(anchor)
                while end < len(lowered) and lowered[end] in _NAME_CHARS and end - index < 40:
                    end += 1
                start = index
                while start and lowered[start - 1] in _NAME_CHARS and index - start < 40:
                    start -= 1
                index = lowered.find(anchor, end)
                if start in starts:
                    continue
                starts.add(start)
                name = lowered[start:end].rstrip("._-")
                if not _NAME.search(name):
                    continue
                match = _ASSIGNED.match(text, start + len(name))
                if match is None:
                    continue
                quoted = match.group("quoted")
                value = quoted if quoted is not None else match.group("bare")
                if _PLACEHOLDER.match(value):
                    continue
                if quoted is None and (
                    (_IDENTIFIER.match(value) and _wordish(value.lower()))
                    or not any(c.isdigit() for c in value)
                    or not any(c.isalpha() for c in value)
                    or shannon_entropy(value) < 3.0
                ):
                    continue  # ``password = read_password()``: code, not a literal
                yield value

    # -- the stage ---------------------------------------------------------------------------

    async def examine(self, batch: StageInput, carried: CarriedState) -> list[Flag]:
        """Scan the new items' text; flag or block; remember what was reported."""
        return await examine_off_loop(batch, self._examine, batch, carried)

    def _examine(self, batch: StageInput, carried: CarriedState) -> list[Flag]:
        seen: dict[bytes, None] = carried.setdefault("seen", {})
        flags: list[Flag] = []
        for item, path in zip(batch.items, batch.paths, strict=True):
            for where, text in iter_texts(item, path):
                findings = self.scan(text)
                if not findings:
                    continue
                new = [f for f in findings if f.fingerprint not in seen]
                repeats = len(findings) - len(new)
                carried["found"] = carried.get("found", 0) + len(findings)
                if self.block:
                    raise ApiError(
                        f"Request blocked: '{where}' contains what looks like "
                        f"{_kinds(findings)}. Remove the credential (values are not echoed) "
                        "and retry.",
                        code=CODE,
                        param=where,
                        status=400,
                    )
                if not new and not self.report_repeats:
                    continue
                for finding in new:
                    seen[finding.fingerprint] = None
                while len(seen) > self.max_fingerprints:
                    del seen[next(iter(seen))]
                reported = findings if self.report_repeats else new
                note = (
                    f" ({repeats} already reported earlier in this conversation)" if repeats else ""
                )
                count = len(reported)
                flags.append(
                    Flag(
                        classifier=self.name,
                        code=CODE,
                        param=where,
                        message=f"Possible {_kinds(reported)} ({count} value"
                        f"{'s' if count != 1 else ''}, not shown){note}.",
                    )
                )
                carried["flags"] = carried.get("flags", 0) + 1
        return flags


def _kinds(findings: list[Finding]) -> str:
    kinds = list(dict.fromkeys(f.kind for f in findings))
    return ", ".join(kinds)


def _random_looking(token: str, min_entropy: float) -> bool:
    """Mixed upper, lower and digits, and high entropy for its length.

    Hex digests (git SHAs, checksums) top out at 4 bits per character and are not reported;
    neither are identifiers such as ``getUserAccountBalance2FromCache``: most of their
    characters sit in lowercase runs of three or more, which random tokens rarely have (under
    0.55 of a random base62 token in 999 of 1000 cases).
    """
    if token == token.lower() or token == token.upper() or _DIGIT.search(token) is None:
        return False  # needs upper case, lower case and digits (so hex digests are out)
    if _wordish(token):
        return False
    segments = _SEPARATORS.split(token)
    if len(segments) >= 3 and max(map(len, segments)) < 16:
        return False  # ``extra_args=_B32_DECODE_MAP``: a structured name, not a key
    # A random string of n characters from a 64-letter alphabet has an expected entropy below
    # log2(n) for short n; scale the threshold so a 32-character key still passes.
    threshold = min(min_entropy, math.log2(len(token)) - 0.7)
    return shannon_entropy(token) >= threshold


def _wordish(text: str) -> bool:
    """Mostly lowercase runs of three letters or more: words, not a random token."""
    return sum(len(run) for run in _WORDISH.findall(text)) >= 0.55 * len(text)


def iter_findings(text: str) -> Iterator[Finding]:
    """Findings of a default classifier (for tools and tests)."""
    yield from SecretsClassifier().scan(text)


register_stage("secrets", SecretsClassifier)
