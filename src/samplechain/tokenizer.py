"""A model's own tokenizer, built from GGUF metadata on the `tokenizers` library.

Two families ship with our models:

* ``gpt2`` (byte-level BPE, SmolLM2): the file's vocabulary and merges; the pre-tokenizer named by
  ``tokenizer.ggml.pre`` (``smollm`` splits every digit, then GPT-2's regex).
* ``llama`` (SentencePiece-style BPE with byte fallback, Gemma 3): spaces become ``▁``; the file has no merges,
  so they are recovered from the vocabulary, best-ranked first.

Special (control) and user-defined tokens are matched whole in the text when ``parse_special`` is on, as
llama.cpp does: the text is cut at them first and each piece between is encoded on its own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

# llama_token_type values in GGUF
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# Token texts llama.cpp treats as end of generation besides EOS/EOT ids (llama-vocab.cpp's list)
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
    "_<EOT>", "<end_of_turn>", "<|end_of_text|>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>",
})

_PRE_TOKENIZER_REGEX = {
    # llama.cpp's regexes for the byte-level pre-tokenizers it names (the ones not covered by ByteLevel's own)
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
              r"|\s+(?!\S)|\s+",
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+",
}
_DIGIT_SPLITTING = frozenset({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"})


def byte_decoder() -> dict[str, int]:
    """GPT-2's printable spelling of bytes, reversed: character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def token_bytes_table(model: str, tokens: Sequence[str], types: np.ndarray) -> list[bytes]:
    """Every token's raw bytes (control and user-defined tokens as their text)."""
    out: list[bytes] = []
    if model == "gpt2":
        decode = byte_decoder()
        for text, kind in zip(tokens, types.tolist(), strict=False):
            if kind in (TOKEN_CONTROL, TOKEN_USER_DEFINED) or not all(ch in decode for ch in text):
                out.append(text.encode("utf-8", errors="surrogateescape"))
            else:
                out.append(bytes(decode[ch] for ch in text))
        return out
    if model == "llama":
        for text, kind in zip(tokens, types.tolist(), strict=False):
            if kind == TOKEN_BYTE and len(text) == 6 and text.startswith("<0x"):
                out.append(bytes([int(text[3:5], 16)]))
            elif kind == TOKEN_CONTROL:
                out.append(text.encode("utf-8", errors="surrogateescape"))
            else:
                out.append(text.replace("▁", " ").encode("utf-8", errors="surrogateescape"))
        return out
    raise ValueError(f"tokenizer model {model!r} is not supported (gpt2, llama)")


def spm_merges(tokens: Sequence[str], rank: dict[str, int]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary: every split of a token into two tokens,
    ordered by the merged token's rank (lower first), then longer left part, then longer right part."""
    found: list[tuple[int, int, int, str, str]] = []
    for token in tokens:
        r = rank[token]
        pairs = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in rank and token[i:] in rank]
        pairs.sort(key=lambda lr: (rank[lr[0]], rank[lr[1]]))
        found.extend((r, -len(left), -len(right), left, right) for left, right in pairs)
    found.sort(key=lambda m: m[:3])
    return [(m[3], m[4]) for m in found]


class GGUFTokenizer:
    """Text <-> token ids for one GGUF vocabulary."""

    def __init__(self, metadata: dict[str, Any]) -> None:
        self.model = str(metadata.get("tokenizer.ggml.model", ""))
        if self.model not in ("gpt2", "llama"):
            raise ValueError(f"tokenizer model {self.model!r} is not supported (gpt2, llama)")
        self.tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
        n = len(self.tokens)
        types = metadata.get("tokenizer.ggml.token_type")
        self.types = np.asarray(types if types is not None else np.full(n, TOKEN_NORMAL), dtype=np.int32)
        self.pre = str(metadata.get("tokenizer.ggml.pre", "default"))
        self._merges = metadata.get("tokenizer.ggml.merges")
        self.add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", self.model == "llama"))
        self.unk = metadata.get("tokenizer.ggml.unknown_token_id")
        specials = [i for i in range(n) if self.types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED) and self.tokens[i]]
        # longest first, so that "<|im_start|>" wins over a shorter token that prefixes it
        specials.sort(key=lambda i: (-len(self.tokens[i]), i))
        self._special_ids = {self.tokens[i]: i for i in reversed(specials)}
        self._special_re = re.compile("|".join(re.escape(self.tokens[i]) for i in specials)) if specials else None
        self._backend: Any = None

    def _build(self) -> Any:
        from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
        from tokenizers.models import BPE

        if self.model == "gpt2":
            rank = {t: i for i, t in reversed(list(enumerate(self.tokens)))}
            merges = [tuple(m.split(" ", 1)) for m in self._merges] if self._merges is not None else []
            tok = Tokenizer(BPE(rank, merges, fuse_unk=False, byte_fallback=False))
            if self.pre in _PRE_TOKENIZER_REGEX:
                split = pre_tokenizers.Split(Regex(_PRE_TOKENIZER_REGEX[self.pre]), behavior="isolated")
                tok.pre_tokenizer = pre_tokenizers.Sequence(
                    [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
            elif self.pre in _DIGIT_SPLITTING:
                tok.pre_tokenizer = pre_tokenizers.Sequence(
                    [pre_tokenizers.Digits(individual_digits=True),
                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
            else:
                tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
            return tok
        # SentencePiece-style: multi-space tokens are stored with real spaces; the model sees them as ▁▁...
        spelled = ["▁" * len(t) if t and not t.strip(" ") else t for t in self.tokens]
        rank = {t: i for i, t in reversed(list(enumerate(spelled)))}
        normal = [t for t, k in zip(spelled, self.types.tolist(), strict=False) if k == TOKEN_NORMAL]
        unk = self.tokens[self.unk] if self.unk is not None else None
        tok = Tokenizer(BPE(rank, spm_merges(normal, rank), unk_token=unk, fuse_unk=True, byte_fallback=True))
        steps = [normalizers.Prepend("▁")] if self.add_space_prefix else []
        tok.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
        return tok

    @property
    def backend(self) -> Any:
        if self._backend is None:
            self._backend = self._build()
        return self._backend

    def encode(self, text: str, parse_special: bool = True) -> list[int]:
        """Token ids of ``text`` (no BOS); with ``parse_special`` control/user-defined tokens match whole."""
        if not text:
            return []
        if not parse_special or self._special_re is None:
            return self._encode_plain(text)
        out: list[int] = []
        pos = 0
        for m in self._special_re.finditer(text):
            if m.start() > pos:
                out.extend(self._encode_plain(text[pos:m.start()]))
            out.append(self._special_ids[m.group()])
            pos = m.end()
        if pos < len(text):
            out.extend(self._encode_plain(text[pos:]))
        return out

    def _encode_plain(self, text: str) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=False).ids)

