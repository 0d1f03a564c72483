"""Injection classifier: instruction-like text in tool outputs.

A tool's output is data, yet a web page, a file or a log line can carry text written for the
model ("ignore all previous instructions", a spoofed ``<|im_start|>system`` turn, "do not tell
the user", ``echo ... | base64 -d | sh``). This stage scores each new tool output against such
patterns: a strong signal alone (score 2) reaches the default threshold, a weak one (score 1)
needs company. Base64 blobs in the output are decoded and scored too, so that encoded
instructions do not slip through. A hit is a ``prompt_injection_suspected`` flag naming the
output's JSON path and the patterns found.

Carried state (per conversation, across turns): how many tool outputs were flagged so far.
With ``block_after=N`` the N-th flagged output of a conversation blocks the request with a 400
``prompt_injection_suspected`` error, for operators who allow an agent a few strikes.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from ..core.ports import ApiError, CarriedState, Flag, StageInput, iter_texts
from .base import examine_off_loop, register_stage, text_windows

CODE = "prompt_injection_suspected"


@dataclass(frozen=True, slots=True)
class InjectionPattern:
    """One signal; ``score`` 2 is strong (flags alone), 1 is weak.

    The regex runs on the ASCII-lowercased text (the original with ``case_sensitive``), and
    only when the text passes the pattern's gate: it has a word from each of ``words`` (a
    cheap set lookup) and, if ``literals`` is set, one of those substrings. Most tool outputs
    pass no gate, so most regexes never run over them. Every regex starts with a literal,
    which the regex engine finds at the speed of a substring search (a leading alternation
    would make it try every position). With ``line_start`` a match counts only at the start
    of a line, after optional indentation.
    """

    name: str
    regex: re.Pattern[str]
    score: int = 2
    words: tuple[frozenset[str], ...] = ()
    literals: tuple[str, ...] = ()
    case_sensitive: bool = False
    line_start: bool = False

    def found(self, haystack: str) -> bool:
        """Whether the regex matches ``haystack`` (at a line start, with ``line_start``)."""
        if not self.line_start:
            return self.regex.search(haystack) is not None
        for match in self.regex.finditer(haystack):
            start = match.start()
            line = haystack.rfind("\n", 0, start) + 1
            if not haystack[line:start].strip():
                return True
        return False


def _p(
    name: str,
    pattern: str,
    score: int = 2,
    *,
    words: tuple[str, ...] = (),
    literals: tuple[str, ...] = (),
    case_sensitive: bool = False,
    line_start: bool = False,
) -> InjectionPattern:
    groups = tuple(frozenset(group.split()) for group in words)
    return InjectionPattern(
        name, re.compile(pattern, re.MULTILINE), score, groups, literals, case_sensitive, line_start
    )


def _family(
    name: str, heads: str, rest: str, score: int = 2, *, words: tuple[str, ...] = ()
) -> tuple[InjectionPattern, ...]:
    """One pattern per leading word of ``heads``, each gated on its own word: the literal
    start keeps the regex fast, and only the words present in the text run."""
    return tuple(
        _p(name, re.escape(head) + rest, score, words=(head, *words)) for head in heads.split()
    )


_FILLER = (
    r"(?:all|any|the|your|my|of|these|those|previous|prior|above|earlier|preceding|original|"
    r"initial|system|developer|existing|current|other)"
)
_MODEL = r"(?:ai|a\.i\.|assistant|agent|llm|language\s+model|model|chatbot|copilot|bot)s?\b"
_MODEL_WORDS = (
    "ai assistant agent llm language model chatbot copilot bot assistants agents llms models "
    "chatbots bots"
)
_SECRETS = "key keys credentials secrets tokens passwords env environment cookies"

PATTERNS: tuple[InjectionPattern, ...] = (
    *_family(
        "override of prior instructions",
        "ignore disregard forget override bypass",
        r"\s+(?:" + _FILLER + r"\s+){1,4}"
        r"(?:instructions?|prompts?|directives|guidelines|guardrails)\b",
        words=("instruction instructions prompt prompts directives guidelines guardrails",),
    ),
    *_family(
        "override of prior instructions",
        "ignore disregard forget",
        r"\s+(?:" + _FILLER + r"\s+){0,3}(?:previous|prior|above|earlier|preceding|your)"
        r"\s+(?:rules|context|messages|commands|constraints|directions)\b",
        words=("previous prior above earlier preceding your",),
    ),
    *_family(
        "override of prior instructions",
        "ignore disregard forget",
        r"\s+(?:everything|anything|all)\s+(?:you\s+were\s+told|"
        r"(?:above|before|previously|said|written)\b)",
        words=("everything anything all",),
    ),
    _p(
        "role tag spoofing",
        r"<\|(?:im_start\|>\s*(?:system|assistant|developer)|im_end\|>|system\|>|endoftext\|>|"
        r"start_header_id\|>|eot_id\|>)",
    ),
    _p("role tag spoofing", r"\[/?INST\]", case_sensitive=True),
    _p("role tag spoofing", r"<</?SYS>>", case_sensitive=True),
    _p("role tag spoofing", r"</?(?:system|system_prompt|system-prompt|developer|instructions)>"),
    _p(
        "role tag spoofing",
        r"##{1,3}[ \t]*(?:system|instructions?|new instructions|system prompt)[ \t]*:?[ \t]*$",
        words=("system instruction instructions",),
        line_start=True,
    ),
    *(
        _p("role label", role + r"[ \t]*:[ \t]*\S", 1, words=(role,), line_start=True)
        for role in ("system", "assistant", "developer")
    ),
    *_family(
        "prompt extraction",
        "reveal print show output repeat leak display dump share",
        r"\s+(?:me\s+|us\s+)?(?:your|the)\s+"
        r"(?:full\s+|entire\s+|hidden\s+|original\s+|initial\s+|exact\s+)?"
        r"(?:system\s+prompt|system\s+message|instructions|developer\s+message)",
        words=("prompt instructions message",),
    ),
    _p("mention of the system prompt", r"system\s+prompt", 1),
    *_family(
        "new instructions",
        "new updated revised real actual additional hidden",
        r"\s+(?:system\s+)?instructions?\s*:",
        words=("instruction instructions",),
    ),
    _p("new instructions", r"from\s+now\s+on,?\s+(?:you|the\s+assistant|ignore|only)\b"),
    *_family(
        "text addressed to the model",
        "note message instruction instructions attention important notice",
        r"\s*(?:to|for)\s+(?:the\s+|any\s+|all\s+)?" + _MODEL,
        words=(_MODEL_WORDS,),
    ),
    _p("text addressed to the model", r"if\s+you\s+are\s+(?:an?\s+)?" + _MODEL),
    _p(
        "persona switch",
        r"you\s+are\s+(?:now|no\s+longer)\s+(?:an?\s+|in\s+|the\s+|my\s+|dan\b|free\b|"
        r"unrestricted\b|jailbroken\b)",
        1,
    ),
    *_family(
        "persona switch", "pretend act", r"\s+(?:to\s+be|as\s+if\s+you|as\s+an?|like\s+an?)\s", 1
    ),
    *_family(
        "secrecy from the user",
        "not don't dont never",
        r"\s+(?:tell|inform|mention|reveal|show|let|alert)\s+"
        r"(?:this\s+to\s+|it\s+to\s+|anything\s+to\s+)?(?:the\s+)?(?:user|human|developer)\b",
        words=("tell inform mention reveal show let alert", "user human developer"),
    ),
    _p(
        "secrecy from the user",
        r"without\s+(?:asking|telling|informing|notifying|alerting)\s+(?:the\s+)?(?:user|human)\b",
        1,
    ),
    _p(
        "encoded command",
        r"base64\s+(?:-d|--decode|-di)\b[^\n|]{0,40}\|\s*(?:sudo\s+)?(?:ba|z|da|k)?sh\b",
    ),
    *_family(
        "encoded command",
        "eval exec",
        r"\s*\(\s*(?:atob|base64_decode|b64decode|base64\.b64decode)",
        words=("atob base64_decode b64decode",),
    ),
    _p(
        "encoded command",
        r"decode\s+(?:this|the\s+following|it)\b[^\n]{0,60}?\s(?:and|then)\s+"
        r"(?:run|execute|follow|obey)",
    ),
    *_family(
        "exfiltration",
        "send upload post forward email transmit leak copy",
        r"\s+(?:all\s+|the\s+|your\s+|any\s+|my\s+)?(?:api\s+keys?|credentials|secrets|"
        r"tokens|passwords|private\s+keys?|ssh\s+keys?|env(?:ironment)?\s+variables|"
        r"\.env\b|cookies)[^\n]{0,60}?(?:\bto\b|\bvia\b)\s+"
        r"(?:https?://|the\s+following|this\s+(?:url|address|server|endpoint)|\S+@\S+)",
        words=(_SECRETS,),
    ),
    _p(
        "exfiltration",
        r"curl\s[^\n]{0,80}(?:\$\(|`)[^\n]{0,40}(?:env\b|printenv|cat\s|id_rsa|\.env\b|\.ssh)",
    ),
    _p("exfiltration", r"exfiltrat", 1),
    *_family("pipe to shell", "curl wget", r"\s[^\n|]{0,200}\|\s*(?:sudo\s+)?(?:ba|z)?sh\b", 1),
)

_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
# Word gates split on punctuation, except the apostrophe of "don't" and the "_" of names.
_PUNCTUATION = str.maketrans({c: " " for c in '!"#$%&()*+,-./:;<=>?@[\\]^`{|}~'})
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_BASE64 = re.compile(r"[A-Za-z0-9+/]{40,}={0,2}|[A-Za-z0-9_-]{40,}={0,2}")


def score_text(text: str) -> tuple[int, list[str]]:
    """The text's score and the names of the patterns found, in pattern order.

    A long text is scanned in windows (``text_windows``): a pattern counts once however many
    windows it is found in, as it does in one scan.
    """
    found: set[int] = set()
    for window in text_windows(text):
        found |= _patterns_found(window, found)
    score = 0
    names: list[str] = []
    for index in sorted(found):
        pattern = PATTERNS[index]
        score += pattern.score
        if pattern.name not in names:
            names.append(pattern.name)
    return score, names


def _patterns_found(text: str, known: set[int]) -> set[int]:
    """Indexes of the patterns found in ``text`` (those in ``known`` are not looked for)."""
    lowered = text.translate(_LOWER)
    words: set[str] | None = None
    found: set[int] = set()
    for index, pattern in enumerate(PATTERNS):
        if index in known:
            continue
        if pattern.words:
            if words is None:
                words = set(lowered.translate(_PUNCTUATION).split())
            if any(words.isdisjoint(group) for group in pattern.words):
                continue
        haystack = text if pattern.case_sensitive else lowered
        if pattern.literals and not any(lit in haystack for lit in pattern.literals):
            continue
        if pattern.found(haystack):
            found.add(index)
    return found


def _decoded_blobs(text: str, limit: int, max_chars: int) -> list[str]:
    """Text hidden in base64 blobs of ``text`` (at most ``limit`` of them)."""
    found: list[str] = []
    words = (w for window in text_windows(text) for w in window.split() if len(w) >= 40)
    for word in dict.fromkeys(words):  # a word in two windows' overlap is decoded once
        for match in _BASE64.finditer(word):
            blob = match.group().rstrip("=")
            if len(blob) > max_chars or len(blob) % 4 == 1:
                continue
            if blob == blob.lower() or blob == blob.upper():
                continue  # hex digests and names: base64 of text mixes cases
            blob += "=" * (-len(blob) % 4)
            try:
                if "-" in blob or "_" in blob:
                    raw = base64.urlsafe_b64decode(blob)
                else:
                    raw = base64.b64decode(blob, validate=True)
                decoded = raw.decode("utf-8")
            except (binascii.Error, ValueError):
                continue
            if _CONTROL.search(decoded) is None:
                found.append(decoded)
                if len(found) >= limit:
                    return found
    return found


class InjectionClassifier:
    """Flags (or, after ``block_after`` flags, blocks) instruction-like tool outputs.

    Settings (``[stage_settings.injection]``):

    - ``threshold``: score at which an output is flagged (default 2: one strong signal or two
      weak ones).
    - ``block_after``: block the request when this many tool outputs of the conversation have
      been flagged (default: never block).
    - ``decode_base64``: also score text decoded from base64 blobs (default on).
    - ``item_types``: which new items to examine (default the tool outputs).
    """

    name = "injection"

    def __init__(
        self,
        *,
        threshold: int = 2,
        block_after: int | None = None,
        decode_base64: bool = True,
        item_types: tuple[str, ...] | list[str] = (
            "function_call_output",
            "custom_tool_call_output",
        ),
        name: str = "injection",
    ) -> None:
        if threshold < 1:
            raise ValueError("threshold must be >= 1")
        if block_after is not None and block_after < 1:
            raise ValueError("block_after must be >= 1 (or unset)")
        self.name = name
        self.threshold = threshold
        self.block_after = block_after
        self.decode_base64 = decode_base64
        self.item_types = frozenset(item_types)

    def classify(self, text: str) -> list[str]:
        """Names of the patterns that put ``text`` over the threshold ([] if it is not)."""
        score, names = score_text(text)
        if self.decode_base64 and score < self.threshold:
            for decoded in _decoded_blobs(text, limit=8, max_chars=65_536):
                inner, inner_names = score_text(decoded)
                if inner:
                    score += max(inner, 2)  # instructions hidden in base64 are a strong signal
                    names.extend(f"{name} (base64-encoded)" for name in inner_names)
        return names if score >= self.threshold else []

    async def examine(self, batch: StageInput, carried: CarriedState) -> list[Flag]:
        """Score the new tool outputs; flag them, or block after ``block_after`` flags."""
        return await examine_off_loop(batch, self._examine, batch, carried)

    def _examine(self, batch: StageInput, carried: CarriedState) -> list[Flag]:
        flags: list[Flag] = []
        for item, path in zip(batch.items, batch.paths, strict=True):
            if item.get("type") not in self.item_types:
                continue
            for where, text in iter_texts(item, path):
                names = self.classify(text)
                if not names:
                    continue
                count = carried["flags"] = carried.get("flags", 0) + 1
                found = ", ".join(dict.fromkeys(names))
                if self.block_after is not None and count >= self.block_after:
                    raise ApiError(
                        f"Request blocked: '{where}' looks like an instruction-injection "
                        f"attempt ({found}); this conversation has {count} such tool outputs "
                        f"(limit {self.block_after}).",
                        code=CODE,
                        param=where,
                        status=400,
                    )
                flags.append(
                    Flag(
                        classifier=self.name,
                        code=CODE,
                        param=where,
                        message=f"Tool output contains instruction-like text: {found} "
                        f"(flag {count} in this conversation).",
                    )
                )
        return flags


register_stage("injection", InjectionClassifier)
