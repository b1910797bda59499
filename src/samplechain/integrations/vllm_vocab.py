"""The vocabulary a vLLM model's requests sample over, as a samplechain :class:`~samplechain.vocab.Vocab`.

Grammars, DRY's sequence breakers, trigger words, string logit biases and ``ignore_eos`` need the token bytes and
the end-of-generation set. ``SAMPLECHAIN_VLLM_VOCAB=/path/model.gguf`` takes them from a GGUF file (llama.cpp's
own tokenizer: exactly what ``CommonSampler`` sees with that model); otherwise they come from the model's Hugging
Face tokenizer (byte-level BPE or SentencePiece pieces decoded to bytes, added tokens as their text). The logits
may be wider than the tokenizer (padded vocabularies): the extra ids become empty control tokens, which no grammar
accepts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

from samplechain.vocab import Vocab

ENV_VOCAB = "SAMPLECHAIN_VLLM_VOCAB"
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class _HFEncoder:
    """A Hugging Face tokenizer as the ``tokenizer`` a :class:`Vocab` tokenizes texts with."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    def encode(self, text: str, parse_special: bool = False) -> list[int]:
        try:
            return list(self.tok.encode(text, add_special_tokens=False, split_special_tokens=not parse_special))
        except TypeError:  # a slow tokenizer without split_special_tokens
            return list(self.tok.encode(text, add_special_tokens=False))


def _token_bytes(pieces: list[str], added: set[int]) -> list[bytes]:
    from samplechain.tokenizer.bpe import byte_decoder

    decoder = byte_decoder()
    plain = [p for i, p in enumerate(pieces) if i not in added and p]
    byte_level = sum(all(ch in decoder for ch in p) for p in plain) > 0.9 * max(len(plain), 1) and not any(
        "\u2581" in p for p in plain[:2000])
    out: list[bytes] = []
    for i, p in enumerate(pieces):
        if p is None:
            out.append(b"")
        elif i in added:
            out.append(p.encode("utf-8"))
        elif byte_level:
            try:
                out.append(bytes(decoder[ch] for ch in p))
            except KeyError:
                out.append(p.encode("utf-8"))
        else:
            m = _BYTE_PIECE.fullmatch(p)
            out.append(bytes([int(m.group(1), 16)]) if m else p.replace("\u2581", " ").encode("utf-8"))
    return out


def vocab_from_hf(tok: Any, n_vocab: int, eos_ids: Iterable[int] = ()) -> Vocab:
    """A :class:`Vocab` of ``n_vocab`` tokens from a Hugging Face tokenizer (padded with empty control tokens)."""
    size = len(tok)
    if size > n_vocab:
        raise ValueError(f"the tokenizer has {size} tokens, more than the model's {n_vocab} logits")
    added_tokens = getattr(tok, "added_tokens_decoder", {}) or {}
    added = {int(i) for i in added_tokens}
    special = {int(i) for i, a in added_tokens.items() if getattr(a, "special", False)}
    special |= {int(i) for i in getattr(tok, "all_special_ids", []) if i is not None and 0 <= i < size}
    pieces = tok.convert_ids_to_tokens(list(range(size)))
    tokens = _token_bytes(pieces, added) + [b""] * (n_vocab - size)
    special |= set(range(size, n_vocab))
    eog = {int(t) for t in eos_ids if t is not None and 0 <= int(t) < n_vocab}
    eos = getattr(tok, "eos_token_id", None)
    bos = getattr(tok, "bos_token_id", None)
    return Vocab(tokens, eog=eog, special=special, bos=bos, eos=eos, add_bos=False, tokenizer=_HFEncoder(tok))


def vocab_for(model_config: Any, n_vocab: int) -> Vocab:
    """The vocabulary for a vLLM ``ModelConfig``: ``$SAMPLECHAIN_VLLM_VOCAB`` (a GGUF file) when set, else the
    model's tokenizer (its generation config's end-of-generation ids join the tokenizer's EOS)."""
    path = os.environ.get(ENV_VOCAB)
    if path:
        vocab = Vocab.from_gguf(path)
        if vocab.n_tokens != n_vocab:
            raise ValueError(f"{ENV_VOCAB}={path} has {vocab.n_tokens} tokens, the model {n_vocab} logits")
        return vocab
    from transformers import AutoTokenizer

    name = getattr(model_config, "tokenizer", None) or model_config.model
    tok = AutoTokenizer.from_pretrained(name, revision=getattr(model_config, "tokenizer_revision", None),
                                        trust_remote_code=bool(getattr(model_config, "trust_remote_code", False)))
    eos: set[int] = set()
    if tok.eos_token_id is not None:
        eos.add(int(tok.eos_token_id))
    try:
        gen = model_config.try_get_generation_config() or {}
        ids = gen.get("eos_token_id")
        eos |= set(ids if isinstance(ids, (list, tuple)) else [] if ids is None else [ids])
    except Exception:  # no generation config: the tokenizer's EOS alone
        pass
    return vocab_from_hf(tok, n_vocab, eos)
