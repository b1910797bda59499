"""Byte-level BPE (llama.cpp's llm_tokenizer_bpe_session): each pre-tokenized word spelled in GPT-2's byte alphabet
and merged by the file's merge ranks, lowest rank first."""

from __future__ import annotations

import re
from collections.abc import Sequence

from samplechain.tokenizer.pretokenize import PreTokenizer
from samplechain.tokenizer.symbol_merge import merge_symbols


def _byte_alphabet() -> list[str]:
    """GPT-2's printable spelling of each byte (unicode_byte_to_utf8_map)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = [""] * 256
    extra = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTE_ALPHABET = _byte_alphabet()
_BYTE_TRANSLATION = {i: ch for i, ch in enumerate(_BYTE_ALPHABET)}


def byte_decoder() -> dict[str, int]:
    """GPT-2's printable spelling of bytes, reversed: character -> byte."""
    return {ch: b for b, ch in enumerate(_BYTE_ALPHABET)}


BYTE_DECODE = byte_decoder()
_SPELLED = re.compile("[" + "".join(re.escape(ch) for ch in BYTE_DECODE) + "]*")
_TO_LATIN1 = str.maketrans({ch: chr(b) for ch, b in BYTE_DECODE.items()})


def spelled_bytes(text: str) -> bytes | None:
    """The bytes GPT-2's printable spelling ``text`` stands for, or None when a character is not a spelled byte
    (one regular-expression match and one translation: a vocabulary's worth takes milliseconds)."""
    return text.translate(_TO_LATIN1).encode("latin-1") if _SPELLED.fullmatch(text) else None


class BpeEncoder:
    """Text -> token ids for a ``gpt2`` vocabulary: ``ignore_merges`` takes a word that is a token whole."""

    def __init__(self, token_to_id: dict[str, int], merges: Sequence[str] | None, ignore_merges: bool,
                 pre_tokenizer: PreTokenizer) -> None:
        self.token_to_id = token_to_id
        self.ignore_merges = ignore_merges
        self.pre_tokenizer = pre_tokenizer
        self._merges = merges
        self._ranks: dict[str, int] | None = None  # "left\0right" -> the merge's rank
        self._cache: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        """Token ids of a text with no special tokens in it, word by word (each word's ids remembered)."""
        out: list[int] = []
        cache = self._cache
        if len(cache) > 200_000:
            cache.clear()
        for word in self.pre_tokenizer.split(text):
            ids = cache.get(word)
            if ids is None:
                ids = cache[word] = self._encode_word(
                    word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_BYTE_TRANSLATION))
            out += ids
        return out

    def _encode_word(self, word: str) -> list[int]:
        vocab = self.token_to_id
        if self.ignore_merges and word in vocab:
            return [vocab[word]]
        syms = list(word)
        if len(syms) > 1:
            ranks = self._ranks if self._ranks is not None else self._load_ranks()
            merge_symbols(syms, ranks, "\0")  # the lowest merge rank first
        out = []
        for sym in syms:
            if not sym:
                continue
            tid = vocab.get(sym)
            if tid is not None:
                out.append(tid)
                continue
            for byte in sym.encode("utf-8"):  # llama.cpp looks each byte up as a one-byte text
                tid = vocab.get(chr(byte)) if byte < 0x80 else None
                if tid is not None:
                    out.append(tid)
        return out

    def _load_ranks(self) -> dict[str, int]:
        ranks: dict[str, int] = {}
        for i, merge in enumerate(self._merges if self._merges is not None else ()):
            at = merge.find(" ", 1)
            pair = merge[:at] + "\0" + merge[at + 1:] if at != -1 else "\0"
            ranks.setdefault(pair, i)
        self._ranks = ranks
        return ranks
