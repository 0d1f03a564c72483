"""A tiny llama.cpp model, written at test time with the ``gguf`` package.

The model is a real ``llama`` architecture GGUF (two layers, 32-wide) whose vocabulary is the
renderer's own: o200k_base plus the harmony chat-format special tokens, ids 0..200018, so the
engine can send the rendered prompt token for token. Its transformer weights are random and
small; the output head is random too, except for a few rows wired as a bigram table. Since
the layers barely move the residual stream, the next token depends on the last one, and the
model answers every prompt that ends in ``<|start|>assistant`` with the same well-formed
completion (``ANSWER_TOKENS``), whatever the sampling temperature. A banned ``<|return|>``
(``logit_bias``) makes it ramble on instead, which the cancel tests use.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import numpy.typing as npt
import tiktoken
from bidi_responses.server.core.rendering import tokenizer
from bidi_responses.server.engines.model_tokenizer import byte_chars

N_EMBD = 32
N_LAYER = 2
N_HEAD = 2
N_FF = 64
N_CTX = 8192


def answer_tokens(encoding: tiktoken.Encoding) -> list[int]:
    """What the model samples after ``<|start|>assistant``: a final answer, then <|return|>."""
    encode = encoding.encode_ordinary
    return [
        tokenizer.CHANNEL,
        *encode("final"),
        tokenizer.MESSAGE,
        *encode("Hello"),
        *encode(" world"),
        *encode("."),
        tokenizer.RETURN,
    ]


def write_tiny_model(path: Path, encoding: tiktoken.Encoding, *, seed: int = 0) -> Path:
    """Write the model to ``path`` (about 26 MB) and return it."""
    n_vocab = tokenizer.ENDOFPROMPT + 1
    to_char = byte_chars()
    specials = {v: k for k, v in tokenizer.SPECIAL_TOKENS.items()}
    tokens: list[str] = []
    types: list[int] = []
    for token_id in range(n_vocab):
        if token_id in specials:
            tokens.append(specials[token_id])
            types.append(gguf.TokenType.CONTROL)
            continue
        try:
            raw = encoding.decode_single_token_bytes(token_id)
        except KeyError:
            tokens.append(f"<|reserved_{token_id}|>")
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append("".join(to_char[b] for b in raw))
        types.append(gguf.TokenType.NORMAL)

    rng = np.random.default_rng(seed)
    embed = rng.standard_normal((n_vocab, N_EMBD)).astype(np.float32)
    embed /= np.linalg.norm(embed, axis=1, keepdims=True)
    output = (rng.standard_normal((n_vocab, N_EMBD)) * 0.02).astype(np.float32)
    chain = [*encoding.encode_ordinary("assistant"), *answer_tokens(encoding)]
    for current, following in itertools.pairwise(chain):
        output[following] = embed[current] * 4.0

    writer = llama_writer(path, "bidi-responses tiny test model", n_vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-4o")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(["Ġ t"])
    writer.add_bos_token_id(tokenizer.ENDOFTEXT)
    writer.add_eos_token_id(tokenizer.RETURN)
    writer.add_add_bos_token(False)

    write_tensors(writer, embed, output, rng, np.float16)
    return path


def llama_writer(path: Path, name: str, n_vocab: int) -> gguf.GGUFWriter:
    """A GGUF writer for the tiny llama architecture, its hyperparameters written."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    return writer


def write_tensors(
    writer: gguf.GGUFWriter,
    embed: npt.NDArray[np.float32],
    output: npt.NDArray[np.float32],
    rng: np.random.Generator,
    dtype: type[np.floating[Any]],
) -> None:
    """The llama architecture's tensors around the given embedding and output matrices (small
    random weights, unit norms), then the whole file; closes ``writer``."""

    def small(*shape: int) -> npt.NDArray[Any]:
        return (rng.standard_normal(shape) * 0.02).astype(dtype)

    writer.add_tensor("token_embd.weight", embed.astype(dtype))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("output.weight", output.astype(dtype))
    for layer in range(N_LAYER):
        prefix = f"blk.{layer}."
        writer.add_tensor(prefix + "attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(prefix + "ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(prefix + name + ".weight", small(N_EMBD, N_EMBD))
        writer.add_tensor(prefix + "ffn_gate.weight", small(N_FF, N_EMBD))
        writer.add_tensor(prefix + "ffn_up.weight", small(N_FF, N_EMBD))
        writer.add_tensor(prefix + "ffn_down.weight", small(N_EMBD, N_FF))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
