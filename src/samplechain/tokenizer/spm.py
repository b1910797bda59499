"""SentencePiece (llama.cpp's llm_tokenizer_spm_session): adjacent symbols merged highest score first, and what is not
a token spelled in byte tokens ``<0xXX>``."""

from __future__ import annotations

import re

from samplechain.tokenizer.symbol_merge import merge_symbols


class SpmEncoder:
    """Text -> token ids for a ``llama`` vocabulary (spaces already ``▁``); ``unk`` stands for a byte with no token."""

    def __init__(self, token_to_id: dict[str, int], scores: list[float], unk: int | None) -> None:
        self.token_to_id = token_to_id
        self.scores = scores
        self.unk = unk
        self._split: re.Pattern[str] | None = None
        self._cache: dict[str, list[int]] = {}
        self._priority: dict[str, float] | None = None  # a token's text -> minus its score

    def encode(self, text: str) -> list[int]:
        """Token ids of a text with no special tokens in it, cut where no merge crosses (each piece's ids
        remembered)."""
        splitter = self._split if self._split is not None else self._splitter()
        out: list[int] = []
        cache = self._cache
        if len(cache) > 200_000:
            cache.clear()
        for chunk in splitter.split(text):
            ids = cache.get(chunk)
            if ids is None:
                ids = cache[chunk] = self._chunk(chunk)
            out += ids
        return out

    def _splitter(self) -> re.Pattern[str]:
        """Where the text can be cut with no merge across the cut: before a ``▁`` whose previous character never
        precedes a ``▁`` inside a token (so the pieces can be tokenized apart and remembered)."""
        before = {t[i - 1] for t in self.token_to_id for i in range(1, len(t)) if t[i] == "\u2581"}
        before.add("\u2581")
        self._split = re.compile("(?<=[^" + "".join(re.escape(c) for c in sorted(before)) + "])(?=\u2581)")
        return self._split

    def _chunk(self, text: str) -> list[int]:
        vocab = self.token_to_id
        if self._priority is None:  # the highest score first: a pair whose text is a token merges
            self._priority = {t: -self.scores[i] for t, i in vocab.items()}
        syms = list(text)
        nxt = merge_symbols(syms, self._priority)
        out: list[int] = []
        i = 0
        while i != -1:
            sym = syms[i]
            tid = vocab.get(sym)
            if tid is not None:
                out.append(tid)
            else:
                for byte in sym.encode("utf-8", "surrogatepass"):  # byte fallback
                    tid = vocab.get(f"<0x{byte:02X}>")
                    if tid is None:
                        tid = vocab.get(chr(byte)) if byte < 0x80 else self.unk
                    if tid is not None:
                        out.append(tid)
            i = nxt[i]
        return out
