"""Embeddings as llama.cpp computes them: the final norm's output of each token (``Context.embed``), pooled per
sequence (``build_pooling`` in src/llama-graph.cpp) and normalized (``common_embd_normalize`` in common/common.cpp).

Pooling types, llama.cpp's ``llama_pooling_type`` in order: ``none`` (every token's vector), ``mean`` (their
mean), ``cls`` (the first token's), ``last`` (the last token's), ``rank`` (a reranker's score: the last token's
vector through the classification head; our architectures have none, so llama.cpp's score is the vector's first
``n_cls_out`` values).
"""

from __future__ import annotations

import numpy as np

from samplechain.gguf import GGUFFile

POOLING = ("none", "mean", "cls", "last", "rank")  # llama_pooling_type 0 .. 4


def model_pooling(gguf: GGUFFile) -> str:
    """The model's own pooling type (``<arch>.pooling_type``); a model without one pools nothing (``none``), as
    llama.cpp's context does when neither the model nor ``--pooling`` names one."""
    value = gguf.arch_get("pooling_type", -1)
    try:
        index = int(value)
    except (TypeError, ValueError):
        return "none"
    return POOLING[index] if 0 <= index < len(POOLING) else "none"


def n_cls_out(gguf: GGUFFile) -> int:
    """How many scores a ``rank`` pooling gives (llama.cpp's ``n_cls_out``: the classifier's labels, else 1)."""
    labels = gguf.arch_get("classifier.output_labels", None)
    return len(labels) if labels else 1


def pool(hidden: np.ndarray, pooling: str, n_scores: int = 1) -> np.ndarray:
    """One sequence's embeddings ``hidden`` [n, n_embd] pooled: [n, n_embd] for ``none``, else one row [1, d]."""
    if pooling not in POOLING:
        raise ValueError(f"unknown pooling type {pooling!r} (one of {', '.join(POOLING)})")
    if hidden.ndim != 2 or hidden.shape[0] == 0:
        raise ValueError("pooling needs the embeddings of at least one token")
    if pooling == "none":
        return hidden
    if pooling == "mean":  # a float32 product with 1/n, as llama.cpp's mean matrix
        return (hidden.sum(axis=0, dtype=np.float32) * np.float32(1.0 / hidden.shape[0]))[None, :]
    if pooling == "cls":
        return hidden[:1]
    if pooling == "last":
        return hidden[-1:]
    return hidden[-1:, :n_scores]  # rank, causal attention: the last token; no classification head


def normalize(vector: np.ndarray, norm: int) -> np.ndarray:
    """``common_embd_normalize``: -1 none, 0 max-absolute scaled to int16's range (32760), 2 euclidean, other p > 0
    the p-norm (1: taxicab). Sums in double precision; a zero vector stays zero. Returns float32."""
    v = np.asarray(vector, dtype=np.float32)
    a = v.astype(np.float64)
    with np.errstate(divide="ignore", over="ignore"):
        if norm == -1:
            total = 1.0
        elif norm == 0:
            total = float(np.abs(a).max(initial=0.0)) / 32760.0
        elif norm == 2:
            total = float(np.sqrt(np.sum(a * a)))
        else:  # llama.cpp applies any other value as a p-norm, negative ones included
            total = float(np.sum(np.abs(a) ** norm)) ** (1.0 / norm)
    scale = np.float32(1.0 / total) if total > 0.0 else np.float32(0.0)
    return v * scale
