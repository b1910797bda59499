"""The merge loop llama.cpp's BPE and SentencePiece sessions share (``llm_tokenizer_bpe_session`` and
``llm_tokenizer_spm_session``): a word's symbols as a linked list, and a heap of adjacent pairs, best first, whose
stale entries (a side merged since) are skipped."""

from __future__ import annotations

import heapq
from collections.abc import Mapping


def merge_symbols(syms: list[str], priority: Mapping[str, float], sep: str = "") -> list[int]:
    """Merge adjacent symbols of ``syms`` in place until no pair merges: the pair with the lowest
    ``priority[left + sep + right]`` first (absent: the pair never merges), the leftmost at ties. A merged pair's
    text goes to its left symbol and its right one becomes ``""``. Returns the links: the symbol after each (-1: the
    last). A mapping, not a function: a call per pair made tokenizing fresh text 15-20 % slower."""
    get = priority.get
    n = len(syms)
    nxt = [*range(1, n), -1]
    prv = list(range(-1, n - 1))
    heap = []
    for i in range(n - 1):
        p = get(syms[i] + sep + syms[i + 1])
        if p is not None:
            heap.append((p, i, i + 1, len(syms[i]) + len(syms[i + 1])))
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        _, left, right, size = pop(heap)
        a, b = syms[left], syms[right]
        if not a or not b or len(a) + len(b) != size:  # symbols only grow: a changed side is longer, or gone
            continue
        merged = syms[left] = a + b
        syms[right] = ""
        after = nxt[right]
        nxt[left] = after
        if after >= 0:
            prv[after] = left
        before = prv[left]
        if before >= 0:
            p = get(syms[before] + sep + merged)
            if p is not None:
                push(heap, (p, before, left, len(syms[before]) + size))
        if after >= 0:
            p = get(merged + sep + syms[after])
            if p is not None:
                push(heap, (p, left, after, size + len(syms[after])))
    return nxt
