"""An open model's own tokenizer, loaded offline from the model's files.

A model must receive token ids of its own vocabulary. ``load_model_tokenizer`` reads them
from a path in the route's config, never from a hub:

* a Hugging Face ``tokenizer.json`` (or the directory holding it, with its
  ``tokenizer_config.json`` for the chat template, the bos/eos tokens and ``add_bos_token``),
  through the ``tokenizers`` library;
* a GGUF file: the vocabulary llama.cpp embeds (``tokenizer.ggml.*``), read as llama.cpp reads
  it: byte-level BPE rebuilt as a ``tokenizers`` BPE with the pre-tokenizer llama.cpp applies
  for that model family, or SentencePiece rebuilt from its pieces and scores; the chat
  template from ``tokenizer.chat_template``, BOS/EOS and ``add_bos_token`` from their keys.

Special tokens are handled as the model does: the rendered prompt's text is split at the
model's added tokens (``<|im_start|>``, ``<|eot_id|>``...), which become their own ids.
Nothing is added that the chat template did not write, except the bos token of a tokenizer
that adds it when the template did not write it (``chat_template``), as llama.cpp does.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import tokenizers
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers

__all__ = ["ModelTokenizer", "TokenizerLoadError", "load_model_tokenizer"]

# The pre-tokenizer split of each llama.cpp BPE family (``tokenizer.ggml.pre``), as in its
# ``llama-vocab.cpp`` and the models' own tokenizer.json files.
_LLAMA3_SPLIT = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
    r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
    r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GGUF_SPLITS: dict[str, str | None] = {
    "qwen2": _QWEN2_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "default": None,  # GPT-2's own byte-level split
    "gpt-2": None,  # llama.cpp's spelling (convert_hf_to_gguf writes it)
    "gpt2": None,
}
# GGUF token types (gguf.TokenType): control and user-defined tokens are matched whole.
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED = 1, 2, 3, 4


class TokenizerLoadError(ValueError):
    """The route's tokenizer could not be loaded; the message names the file and the reason."""


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable character -> byte map, inverted (byte-level BPE token text)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


@functools.cache
def byte_chars() -> dict[int, str]:
    """Byte -> GPT-2's printable character (byte-level BPE token text)."""
    return {b: c for c, b in _byte_decoder().items()}


@dataclass(slots=True)
class ModelTokenizer:
    """A model's tokenizer plus what its chat format needs from the model's files."""

    tokenizer: tokenizers.Tokenizer
    # Where it came from (for messages and for the format's name).
    source: str
    # The chat template shipped with the model ("" when the files carry none).
    chat_template: str = ""
    bos_token: str = ""
    eos_token: str = ""
    # The tokenizer puts the bos token before a prompt (GGUF ``tokenizer.ggml.add_bos_token``,
    # ``add_bos_token`` in tokenizer_config.json), as llama.cpp's chat path does with it.
    add_bos: bool = False
    # Other tokens that end the model's turn (GGUF ``eot``/``eom`` token ids).
    end_tokens: tuple[str, ...] = ()
    # Byte-level BPE (GPT-2 style token text) rather than SentencePiece-style (``▁``, <0xNN>).
    byte_level: bool = True
    # Added tokens (specials and user-defined ones such as ``<tool_call>``): content -> id.
    added: dict[str, int] = field(default_factory=dict)
    _added_ids: frozenset[int] = frozenset()
    _special_ids: frozenset[int] = frozenset()
    _bytes_table: dict[int, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.added = {
            token.content: token_id
            for token_id, token in self.tokenizer.get_added_tokens_decoder().items()
        }
        self._added_ids = frozenset(self.added.values())
        decoder = self.tokenizer.get_added_tokens_decoder()
        self._special_ids = frozenset(i for i, token in decoder.items() if token.special)

    @property
    def vocab_size(self) -> int:
        """Ids run from 0 to ``vocab_size - 1``."""
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered prompt text: added tokens matched whole, nothing added."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_with_splits(self, text: str) -> tuple[list[int], list[tuple[int, int, int]]]:
        """Token ids, and the (start, end, token index) of each added token (character
        offsets of the text it covers).

        The text before an added token tokenizes on its own, so a render that keeps the text
        up to one of these points keeps the tokens up to it too (``chat_template``)."""
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        ids: list[int] = list(encoding.ids)
        added = self._added_ids
        splits = [
            (offsets[0], offsets[1], index)
            for index, (token, offsets) in enumerate(zip(ids, encoding.offsets, strict=True))
            if token in added
        ]
        return ids, splits

    def encode_text(self, text: str) -> list[int]:
        """Sampled text back to ids (``sampled_ids``): the same as ``encode``."""
        return self.encode(text)

    def split_bytes(self, data: bytes) -> list[int]:
        """``data``, which may end or start inside a character, as the model's BPE splits it
        (byte-level), or as byte-fallback tokens ``<0xNN>`` (SentencePiece)."""
        if self.byte_level:
            chars = byte_chars()
            pieces = self.tokenizer.model.tokenize("".join(chars[b] for b in data))
            return [int(piece.id) for piece in pieces]
        found = [self.tokenizer.token_to_id(f"<0x{b:02X}>") for b in data]
        return [int(i) for i in found if i is not None]

    def token_id(self, text: str) -> int | None:
        """The id of a token written exactly as ``text`` (an added token), or None."""
        found = self.added.get(text)
        if found is not None:
            return found
        token = self.tokenizer.token_to_id(text)
        return int(token) if token is not None else None

    def is_special(self, token: int) -> bool:
        """Whether ``token`` is a special (control) token, which is never text."""
        return token in self._special_ids

    def is_added(self, token: int) -> bool:
        """Whether ``token`` is one of the model's added (special or user-defined) tokens."""
        return token in self._added_ids

    def token_bytes(self, token: int) -> bytes:
        """The bytes ``token`` stands for (an added token: its text); b"" for an unknown id."""
        table = self._bytes_table
        cached = table.get(token)
        if cached is not None:
            return cached
        text = self.tokenizer.id_to_token(token)
        if text is None:
            return b""
        if token in self._added_ids:
            raw = text.encode()
        elif self.byte_level:
            decoder = _byte_decoder()
            raw = bytes(decoder.get(ch, 0x3F) for ch in text)
        elif len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            raw = bytes([int(text[3:5], 16)])  # SentencePiece byte fallback
        else:
            raw = text.replace("\u2581", " ").encode()
        table[token] = raw
        return raw


def load_model_tokenizer(path: str | Path) -> ModelTokenizer:
    """The tokenizer at ``path``: a tokenizer.json, a directory holding one, or a GGUF file."""
    where = Path(path)
    if where.is_dir():
        where = where / "tokenizer.json"
    if not where.is_file():
        raise TokenizerLoadError(f"tokenizer: no such file {str(where)!r}")
    if where.suffix == ".gguf":
        return _from_gguf(where)
    return _from_tokenizer_json(where)


def _from_tokenizer_json(path: Path) -> ModelTokenizer:
    try:
        tokenizer = tokenizers.Tokenizer.from_file(str(path))
        spec = json.loads(path.read_text(encoding="utf-8"))
    except Exception as exc:
        raise TokenizerLoadError(f"tokenizer: cannot read {str(path)!r}: {exc}") from None
    decoder = spec.get("decoder") or {}
    kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", ())}
    config: dict[str, object] = {}
    config_path = path.with_name("tokenizer_config.json")
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise TokenizerLoadError(
                f"tokenizer: cannot read {str(config_path)!r}: {exc}"
            ) from None
    template = config.get("chat_template") or ""
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), "")
    jinja = path.with_name("chat_template.jinja")
    if not template and jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    return ModelTokenizer(
        tokenizer,
        str(path),
        chat_template=str(template or ""),
        bos_token=_token_text(config.get("bos_token")),
        eos_token=_token_text(config.get("eos_token")),
        add_bos=config.get("add_bos_token") is True,
        byte_level="ByteLevel" in kinds,
    )


def _token_text(value: object) -> str:
    if isinstance(value, dict):  # {"content": "<s>", ...}
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _from_gguf(path: Path) -> ModelTokenizer:
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:
        raise TokenizerLoadError(f"tokenizer: cannot read GGUF {str(path)!r}: {exc}") from None

    def value(key: str) -> object:
        found = reader.get_field(key)
        return found.contents() if found is not None else None

    kind = value("tokenizer.ggml.model")
    if kind == "llama":
        return _sentencepiece_from_gguf(path, value)
    if kind != "gpt2":
        raise TokenizerLoadError(
            f"tokenizer: {str(path)!r}: tokenizer.ggml.model is {kind!r}; only byte-level BPE "
            "('gpt2') and SentencePiece ('llama') vocabularies are read from GGUF. Point "
            "'tokenizer' at the model's tokenizer.json."
        )
    pre = str(value("tokenizer.ggml.pre") or "default")
    if pre not in _GGUF_SPLITS:
        raise TokenizerLoadError(
            f"tokenizer: {str(path)!r}: tokenizer.ggml.pre is {pre!r}, a llama.cpp "
            f"pre-tokenizer not supported here ({', '.join(_GGUF_SPLITS)}); point 'tokenizer' "
            "at the model's tokenizer.json."
        )
    tokens = value("tokenizer.ggml.tokens")
    merges = value("tokenizer.ggml.merges") or []
    types = value("tokenizer.ggml.token_type") or []
    if not isinstance(tokens, list) or not isinstance(merges, list) or not isinstance(types, list):
        raise TokenizerLoadError(f"tokenizer: {str(path)!r} has no readable vocabulary")
    vocab = {token: index for index, token in enumerate(tokens)}
    pairs = [tuple(merge.split(" ", 1)) for merge in merges]
    tokenizer = tokenizers.Tokenizer(
        models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre in ("llama-bpe", "llama3"))
    )
    split = _GGUF_SPLITS[pre]
    if split is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tokenizer.decoder = decoders.ByteLevel()
    specials = [
        tokenizers.AddedToken(tokens[i], special=types[i] == _CONTROL, normalized=False)
        for i in range(len(tokens))
        if i < len(types) and types[i] in (_CONTROL, _USER_DEFINED)
    ]
    tokenizer.add_special_tokens(specials)

    def token_at(key: str) -> str:
        index = value(key)
        return tokens[index] if isinstance(index, int) and 0 <= index < len(tokens) else ""

    return ModelTokenizer(
        tokenizer,
        str(path),
        chat_template=str(value("tokenizer.chat_template") or ""),
        bos_token=token_at("tokenizer.ggml.bos_token_id"),
        eos_token=token_at("tokenizer.ggml.eos_token_id"),
        add_bos=value("tokenizer.ggml.add_bos_token") is True,
        end_tokens=tuple(
            found
            for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
            if (found := token_at(key))
        ),
        byte_level=True,
    )


def _sentencepiece_from_gguf(path: Path, value: Callable[[str], object]) -> ModelTokenizer:
    """A SentencePiece vocabulary (``tokenizer.ggml.model = "llama"``: Llama 2, Mistral up to
    v0.3, Gemma) as llama.cpp tokenizes with it: text between added tokens gets "▁" for its
    spaces and one in front (``add_space_prefix``), then pieces merge highest score first
    (a BPE whose merges are ranked by the merged piece's score), and a character the
    vocabulary lacks falls back to its ``<0xNN>`` byte tokens."""
    tokens = value("tokenizer.ggml.tokens")
    scores = value("tokenizer.ggml.scores")
    types = value("tokenizer.ggml.token_type")
    if not isinstance(tokens, list) or not isinstance(scores, list) or not isinstance(types, list):
        raise TokenizerLoadError(
            f"tokenizer: {str(path)!r}: tokenizer.ggml.tokens, .scores or .token_type is missing"
        )
    vocab = {str(token): index for index, token in enumerate(tokens)}
    ranked: list[tuple[float, int, str, str]] = []
    for index, piece in enumerate(tokens):
        if index >= len(types) or types[index] != _NORMAL:
            continue
        piece = str(piece)
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-float(scores[index]), index, left, right))
    ranked.sort()
    model = models.BPE(
        vocab=vocab,
        merges=[(left, right) for _, _, left, right in ranked],
        unk_token=str(tokens[0]) if types and types[0] == _UNKNOWN else None,
        byte_fallback=True,
        fuse_unk=True,
    )
    tokenizer = tokenizers.Tokenizer(model)
    steps: list[normalizers.Normalizer] = []
    if value("tokenizer.ggml.add_space_prefix") is not False:  # llama.cpp's default: on
        steps.append(normalizers.Prepend("\u2581"))
    steps.append(normalizers.Replace(" ", "\u2581"))
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tokenizer.add_special_tokens(
        [
            tokenizers.AddedToken(str(tokens[i]), special=types[i] == _CONTROL, normalized=False)
            for i in range(min(len(tokens), len(types)))
            if types[i] in (_CONTROL, _USER_DEFINED)
        ]
    )

    def token_at(key: str) -> str:
        index = value(key)
        return str(tokens[index]) if isinstance(index, int) and 0 <= index < len(tokens) else ""

    add_bos = value("tokenizer.ggml.add_bos_token")
    return ModelTokenizer(
        tokenizer,
        str(path),
        chat_template=str(value("tokenizer.chat_template") or ""),
        bos_token=token_at("tokenizer.ggml.bos_token_id"),
        eos_token=token_at("tokenizer.ggml.eos_token_id"),
        add_bos=add_bos is not False,  # SentencePiece models add BOS unless they say not
        end_tokens=tuple(
            found
            for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
            if (found := token_at(key))
        ),
        byte_level=False,
    )


def decode_tokens(tokenizer: ModelTokenizer, ids: Sequence[int]) -> str:
    """The text of ``ids`` (invalid UTF-8 replaced), for messages and tests."""
    return b"".join(tokenizer.token_bytes(i) for i in ids).decode("utf-8", "replace")
