"""A tiny open model for llama.cpp, with a vocabulary and chat template of its own.

Unlike ``tiny_gguf`` (the o200k/Harmony vocabulary of gpt-oss), this model is what most
deployments serve: a byte-level BPE vocabulary trained at test time (``tokenizers``, a few
hundred tokens, ``qwen2`` pre-tokenizer), ChatML control tokens, ``<tool_call>`` tags as added
tokens, and a Qwen-style chat template with tools in ``tokenizer.chat_template``.

The weights are random and small except for an output head wired as a bigram table, so the
next token depends on the last one. After the generation prompt (``<|im_start|>assistant\\n``)
the model calls a tool: ``<tool_call>``, one token holding the call's JSON, ``</tool_call>``,
``<|im_end|>``. With ``<tool_call>`` banned (``tool_choice: "none"``) it answers
``Hello world.`` instead. The call's JSON is a single token the BPE never produces itself, so
the next turn's render of that call tokenizes differently from what was sampled, as happens
with real models.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import gguf
import numpy as np
import tokenizers
from bidi_responses.bench.tiny_gguf import (
    N_EMBD,
    llama_writer,
    write_tensors,
)
from bidi_responses.server.engines.model_tokenizer import byte_chars

from tests.engines.model_files import CHATML, CORPUS, TAGS, train_tokenizer

CALL_JSON = '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
CALL_ARGUMENTS = '{"city": "Paris"}'
ANSWER = "Hello world."


def open_tokenizer() -> tokenizers.Tokenizer:
    """The model's tokenizer (the same training run every time: deterministic)."""
    return train_tokenizer()


def write_open_model(
    path: Path, *, seed: int = 0, pre: str = "qwen2", add_bos: bool = False
) -> Path:
    """Write the model to ``path`` (well under 1 MB) and return it; ``pre`` is the
    pre-tokenizer name written for llama.cpp, ``add_bos`` whether its tokenizer adds BOS."""
    tokenizer = open_tokenizer()
    spec = json.loads(tokenizer.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    added = {token["id"]: token for token in spec["added_tokens"]}
    to_char = byte_chars()
    call_token = "".join(to_char[b] for b in CALL_JSON.encode())
    n_vocab = max([*vocab.values(), *added]) + 2
    texts = [""] * n_vocab
    types = [gguf.TokenType.NORMAL] * n_vocab
    for text, token_id in vocab.items():
        texts[token_id] = text
    for token_id, token in added.items():
        texts[token_id] = token["content"]
        types[token_id] = (
            gguf.TokenType.CONTROL if token["special"] else gguf.TokenType.USER_DEFINED
        )
    texts[n_vocab - 1] = call_token  # sampled, never produced by the BPE itself
    merges = [
        " ".join(pair) if isinstance(pair, list) else pair for pair in spec["model"]["merges"]
    ]

    def tid(text: str) -> int:
        return texts.index(text)

    rng = np.random.default_rng(seed)
    embed = rng.standard_normal((n_vocab, N_EMBD)).astype(np.float32)
    embed /= np.linalg.norm(embed, axis=1, keepdims=True)
    output = (rng.standard_normal((n_vocab, N_EMBD)) * 0.02).astype(np.float32)
    newline = tid("Ċ")
    call = [tid("<tool_call>"), n_vocab - 1, tid("</tool_call>")]
    answer = tokenizer.encode(ANSWER, add_special_tokens=False).ids
    end = tid("<|im_end|>")
    output[call[0]] = embed[newline] * 4.0
    output[call[1]] = embed[call[0]] * 4.0
    output[call[2]] = embed[call[1]] * 4.0
    output[answer[0]] = embed[newline] * 3.0  # second choice after the generation prompt
    for current, following in itertools.pairwise(answer):
        output[following] = embed[current] * 4.0
    output[end] = (embed[answer[-1]] + embed[call[2]]) * 4.0

    writer = llama_writer(path, "bidi-responses tiny open model", n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(texts)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tid("<|endoftext|>"))
    writer.add_eos_token_id(end)
    writer.add_add_bos_token(add_bos)
    writer.add_chat_template(CHATML)

    write_tensors(writer, embed, output, rng, np.float32)
    return path


def write_sentencepiece_model(path: Path, *, seed: int = 0) -> Path:
    """The same kind of model with a SentencePiece vocabulary (``tokenizer.ggml.model =
    "llama"``, as Llama 2 and Mistral ship): pieces with ``▁`` for spaces and scores, the 256
    byte-fallback tokens (a character the pieces lack, an emoji say, is written in bytes),
    ``<s>``/``</s>``, BOS added by the tokenizer and the ChatML control tokens. Random
    weights: what it writes is steered per request (a grammar)."""
    trained = tokenizers.Tokenizer(tokenizers.models.BPE())
    trained.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=400, show_progress=False)
    trained.train_from_iterator(CORPUS * 4, trainer)
    pieces = sorted(trained.get_vocab().items(), key=lambda item: item[1])
    texts = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    scores = [0.0] * len(texts)
    for rank, (piece, _) in enumerate(pieces):
        texts.append(piece)
        types.append(gguf.TokenType.NORMAL)
        scores.append(-float(rank))  # earlier merges score higher
    for special in ("<|im_start|>", "<|im_end|>"):
        texts.append(special)
        types.append(gguf.TokenType.CONTROL)
        scores.append(0.0)
    for tag in TAGS:
        texts.append(tag)
        types.append(gguf.TokenType.USER_DEFINED)
        scores.append(0.0)
    n_vocab = len(texts)
    rng = np.random.default_rng(seed)
    embed = rng.standard_normal((n_vocab, N_EMBD)).astype(np.float32)
    embed /= np.linalg.norm(embed, axis=1, keepdims=True)
    output = (rng.standard_normal((n_vocab, N_EMBD)) * 0.02).astype(np.float32)

    writer = llama_writer(path, "bidi-responses tiny SentencePiece model", n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(texts)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(texts.index("<|im_end|>"))
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(True)
    writer.add_chat_template(CHATML)
    write_tensors(writer, embed, output, rng, np.float32)
    return path
