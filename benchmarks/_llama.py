"""llama.cpp's own sampler API through llama-cpp-python (ctypes), on the same logits as ours.

Builds a llama.cpp chain equivalent to one of our chains, applies it to a candidate array filled from NumPy,
and times only ``llama_sampler_apply`` (filling the array from Python is not part of llama.cpp's cost).
"""

from __future__ import annotations

import ctypes
import time

import numpy as np

import samplechain as sc

try:
    import llama_cpp.llama_cpp as L
except ImportError:  # the benchmark environment installs it: pip install -e '.[bench]'
    L = None

TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


def without_extra_bufts() -> None:
    """Load llama.cpp models with ``use_extra_bufts=False`` (ggml's AMX path segfaults on
    some machines of this kind). ``Llama(use_extra_bufts=False)`` is swallowed by its ``**kwargs`` in 0.3.36, so the
    default model parameters, read by ``Llama.__init__`` at call time, are patched instead (once)."""
    import llama_cpp.llama_cpp as C

    if getattr(C.llama_model_default_params, "_without_extra_bufts", False):
        return
    default_params = C.llama_model_default_params

    def model_params():
        params = default_params()
        params.use_extra_bufts = False
        return params

    model_params._without_extra_bufts = True
    C.llama_model_default_params = model_params


def available() -> bool:
    return L is not None


def _one(s: sc.Sampler):
    """The llama.cpp sampler with the same parameters as ours."""
    if isinstance(s, sc.Greedy):
        return L.llama_sampler_init_greedy()
    if isinstance(s, sc.Dist):
        return L.llama_sampler_init_dist(s.seed)
    if isinstance(s, sc.TopK):
        return L.llama_sampler_init_top_k(s.k)
    if isinstance(s, sc.TopP):
        return L.llama_sampler_init_top_p(float(s.p), s.min_keep)
    if isinstance(s, sc.MinP):
        return L.llama_sampler_init_min_p(float(s.p), s.min_keep)
    if isinstance(s, sc.Typical):
        return L.llama_sampler_init_typical(float(s.p), s.min_keep)
    if isinstance(s, sc.Temperature):
        return L.llama_sampler_init_temp(float(s.t))
    if isinstance(s, sc.DynamicTemperature):
        return L.llama_sampler_init_temp_ext(float(s.t), float(s.delta), float(s.exponent))
    if isinstance(s, sc.XTC):
        return L.llama_sampler_init_xtc(float(s.p), float(s.t), s.min_keep, s.seed)
    if isinstance(s, sc.TopNSigma):
        return L.llama_sampler_init_top_n_sigma(float(s.n))
    if isinstance(s, sc.MirostatV2):
        return L.llama_sampler_init_mirostat_v2(s.seed, float(s.tau), float(s.eta))
    if isinstance(s, sc.Mirostat):
        return L.llama_sampler_init_mirostat(s.n_vocab, s.seed, float(s.tau), float(s.eta), s.m)
    if isinstance(s, sc.Penalties):
        return L.llama_sampler_init_penalties(0, s.last_n, float(s.repeat), float(s.freq), float(s.present))
    if isinstance(s, sc.AdaptiveP):
        return L.llama_sampler_init_adaptive_p(float(s.target), float(s.decay), s.seed)
    if isinstance(s, sc.LogitBias):
        n = len(s.biases)
        arr = (L.llama_logit_bias * max(n, 1))()
        for i, (t, b) in enumerate(s.biases.items()):
            arr[i].token = t
            arr[i].bias = b
        return L.llama_sampler_init_logit_bias(s.n_vocab or 0, n, arr)
    raise ValueError(f"no llama.cpp mapping for {s!r}")


class LlamaChain:
    """A llama.cpp sampler chain mirroring ``samplers`` (fresh samplers with the same parameters and seeds)."""

    def __init__(self, samplers) -> None:
        params = L.llama_sampler_chain_default_params()
        self.chain = L.llama_sampler_chain_init(params)
        for s in samplers:
            L.llama_sampler_chain_add(self.chain, _one(s))
        self._buf = None

    def __del__(self) -> None:
        if L is not None and getattr(self, "chain", None) is not None:
            L.llama_sampler_free(self.chain)

    def _fill(self, logits: np.ndarray):
        n = len(logits)
        if self._buf is None or len(self._buf) != n:
            self._buf = np.zeros(n, dtype=TOKEN_DATA)
            self._ids = np.arange(n, dtype=np.int32)
        buf = self._buf
        buf["id"] = self._ids
        buf["logit"] = logits
        buf["p"] = 0.0
        return L.llama_token_data_array(
            data=buf.ctypes.data_as(ctypes.POINTER(L.llama_token_data)), size=n, selected=-1, sorted=False)

    def apply(self, logits: np.ndarray):
        """Apply once; returns (ids, logits, p, selected, sorted, apply_seconds)."""
        arr = self._fill(logits)
        t0 = time.perf_counter()
        L.llama_sampler_apply(self.chain, ctypes.byref(arr))
        dt = time.perf_counter() - t0
        base = ctypes.addressof(arr.data.contents) - self._buf.ctypes.data
        start = base // TOKEN_DATA.itemsize
        out = self._buf[start : start + arr.size]
        return out["id"].copy(), out["logit"].copy(), out["p"].copy(), arr.selected, bool(arr.sorted), dt

    def accept(self, token: int) -> None:
        L.llama_sampler_accept(self.chain, token)

    def sample(self, logits: np.ndarray) -> tuple[int, float]:
        ids, _, _, sel, _, dt = self.apply(logits)
        token = int(ids[sel])
        self.accept(token)
        return token, dt
