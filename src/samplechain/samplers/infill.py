"""Infill: for fill-in-the-middle, prefers end-of-generation or merges tokens sharing a prefix (llama.cpp's
llama_sampler_infill_apply, src/llama-sampler.cpp)."""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

import numpy as np

from samplechain._numeric import F32, NEG_INF, seq_sum_f32
from samplechain.candidates import Candidates
from samplechain.samplers._ops import softmax
from samplechain.samplers.base import FILTER, Sampler

if TYPE_CHECKING:
    from samplechain.vocab import Vocab

_THRESHOLD = F32(0.2)


class Infill(Sampler):
    """llama.cpp's infill sampler; needs the vocabulary (pieces and end-of-generation tokens)."""

    name = "infill"
    effect = FILTER

    def __init__(self, vocab: Vocab) -> None:
        if vocab is None:
            raise ValueError("infill needs a vocabulary")
        self.vocab = vocab

    def clone(self) -> Infill:
        return Infill(self.vocab)

    def apply(self, c: Candidates) -> None:
        n = len(c)
        if n == 0:
            return
        probs = softmax(c, do_sort=True).copy()
        ids = c.ids
        is_eog = np.fromiter((self.vocab.is_eog(int(t)) for t in ids), dtype=bool, count=n)
        p_eog = seq_sum_f32(probs[is_eog])
        p_txt = seq_sum_f32(probs[~is_eog])
        if F32(F32(F32(3.0) * p_eog) * F32(n)) > p_txt:
            keep = np.flatnonzero(is_eog)
            kept = probs[keep]
            c.take(keep)
            c.set_probs(kept / seq_sum_f32(kept))
            return
        logits = c.logits.copy()
        self._merge_prefixes([self.vocab.piece(int(t)) for t in ids], logits, probs)
        c.set_logits(logits, probs)
        keep = np.flatnonzero((probs >= _THRESHOLD) | is_eog)
        n_txt = int(np.count_nonzero(~is_eog[keep]))
        if n_txt == 0:
            eot = self.vocab.eot if self.vocab.eot is not None else self.vocab.eos
            if eot is None:
                raise ValueError("infill: the vocabulary has neither an EOT nor an EOS token")
            p0 = probs[keep[0]] if len(keep) else probs[0]  # llama.cpp leaves this entry's old p
            c.replace(np.array([eot], dtype=np.int32), np.array([1.0], dtype=F32),
                      np.array([p0], dtype=F32), sorted=True)
            return
        kept_eog = is_eog[keep]
        kept = probs[keep]
        kept = kept / seq_sum_f32(kept)
        thr = F32(1.0) / F32(n_txt + 1)
        keep2 = np.flatnonzero((kept >= thr) | kept_eog)
        final = kept[keep2]
        c.take(keep[keep2])
        c.set_probs(final / seq_sum_f32(final))

    @staticmethod
    def _merge_prefixes(pieces: list[bytes], logits: np.ndarray, probs: np.ndarray) -> None:
        """For every ordered pair (i0, i1) in llama.cpp's loop order where piece i0 is a non-empty prefix of
        piece i1, merge the less probable into the more probable one. Only prefix pairs can merge, so they
        are found by bisection in the sorted pieces instead of testing all n^2 pairs."""
        by_piece = sorted(range(len(pieces)), key=pieces.__getitem__)
        sorted_pieces = [pieces[i] for i in by_piece]
        for i0, p0 in enumerate(pieces):
            if not p0 or logits[i0] == NEG_INF:
                continue
            j = bisect.bisect_left(sorted_pieces, p0)
            matches = []
            while j < len(sorted_pieces) and sorted_pieces[j].startswith(p0):
                if by_piece[j] != i0:
                    matches.append(by_piece[j])
                j += 1
            for i1 in sorted(matches):
                if logits[i0] == NEG_INF:
                    break
                if logits[i1] == NEG_INF:
                    continue
                src, dst = (i0, i1) if probs[i1] > probs[i0] else (i1, i0)
                probs[dst] = probs[dst] + probs[src]
                logits[src] = NEG_INF
                probs[src] = F32(0.0)
