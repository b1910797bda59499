"""Which forward a model runs on this machine, chosen by timing, never from a CPU flag.

On CUDA the candidates are ``cuda-graph`` (decode steps replayed as CUDA graphs, float32), ``cuda-graph-tf32`` (the
same with TF32 matrix products) and ``cuda-eager``.

Candidates on the CPU: the compiled engine's kernel variants (``c-avx512vnni``, ``c-avx2``, ``c-generic``: the same
bits, batch-invariant) and torch's paths (``torch-int4-f32``, ``torch-int4-bf16``: torch's int4 kernel with float32 or
bfloat16 activations; ``torch-dense``: the dequantized reference). At first use for a machine and model shape the
compiled engine's variants this CPU can run are timed on decode steps (and checked to give the same bits) and the
fastest is kept; torch's paths are measured, against the dequantized reference, only when no compiled engine can be
built. The choice is cached in ``<cache dir>/kernels.json``; ``SAMPLECHAIN_KERNEL=name`` overrides it.

``c-avx2-q8`` quantizes activations to 8 bits as llama.cpp does (``vpmaddubsw``: about twice the multiply-adds per
instruction of the 16-bit kernels on AVX2, so multi-token forwards are cheaper), batch-invariant like the others but
its own family of bits, ~5% of the largest logit from the dequantized model where the 16-bit kernels are ~0.03%
(``report`` shows both). It is opt-in (``kernel="c-avx2-q8"``, ``--kernel``, ``SAMPLECHAIN_KERNEL``), never chosen by
measurement: the automatic choice stays within the 16-bit family, whose variants give the same bits on every CPU, so
that a seed gives the same text on every machine. ``measure(t, opt_in=True)`` times and checks it too (within
``ACCURACY_BOUND`` of the 16-bit logits, which are within 0.002 of the dequantized model's).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from samplechain.runtime import cpu_engine
from samplechain.runtime.cpu_engine import CEngine, EngineUnavailable
from samplechain.runtime.model import Transformer

# A candidate's logits may differ from the dequantized reference by this fraction of the reference's largest |logit|
# (llama.cpp's own 8-bit activations reach ~5% on SmolLM2 text; top-1 agreement is reported, not required: on the
# calibration ids, which are not text, many positions are close calls).
ACCURACY_BOUND = 0.08
CALIBRATION = np.array([1, 504, 3458, 2365, 1790, 260, 15451, 5346, 253, 2756, 28, 837, 314, 30, 216, 40],
                       dtype=np.int64)
DECODE_STEPS = 10
BATCH = 8
OPT_IN = {"c-avx2-q8"}  # other numerics than the 16-bit family: chosen by name only


def _c(isa: str) -> Callable[[Transformer], Transformer]:
    return lambda t: t.with_engine(CEngine(t, isa), f"c-{isa}")


def _cuda_graph(tf32: bool) -> Callable[[Transformer], Transformer]:
    def build(t: Transformer) -> Transformer:
        from samplechain.runtime.cuda_graphs import CudaGraphEngine

        return t.with_engine(CudaGraphEngine(tf32=tf32), "cuda-graph-tf32" if tf32 else "cuda-graph")

    return build


CUDA_CANDIDATES: dict[str, tuple[Callable[[Transformer], Transformer], bool]] = {
    "cuda-graph": (_cuda_graph(False), False),
    "cuda-graph-tf32": (_cuda_graph(True), False),
    "cuda-eager": (lambda t: t.with_engine(None, "cuda-eager"), False),
}
CPU_CANDIDATES: dict[str, tuple[Callable[[Transformer], Transformer], bool]] = {
    # name: (build, batch-invariant)
    "c-avx512vnni": (_c("avx512vnni"), True),
    "c-avx2": (_c("avx2"), True),
    "c-generic": (_c("generic"), True),
    "c-avx2-q8": (_c("avx2-q8"), True),
    "torch-int4-f32": (lambda t: t.with_int4_dtype(torch.float32), False),
    "torch-int4-bf16": (lambda t: t.with_int4_dtype(torch.bfloat16), False),
    "torch-dense": (lambda t: t.dense(), False),
}


@dataclass
class Trial:
    name: str
    decode_ms: float | None = None
    error: float | None = None
    agreement: float | None = None
    invariant: bool = False
    problem: str | None = None
    batch_ms: float | None = None  # a BATCH-token forward
    score: float | None = None  # decode_ms + batch_ms / BATCH: what the choice minimises

    @property
    def eligible(self) -> bool:
        return self.problem is None and self.decode_ms is not None

    @property
    def eligible_to_time(self) -> bool:
        return self.problem is None


def shape_key(t: Transformer) -> str:
    c = t.config
    kinds = sorted({lin.form for layer in t.layers for lin in (layer.qkv, layer.wo, layer.gate_up, layer.down)})
    return (f"{c.arch} L{c.n_layer} E{c.n_embd} H{c.n_head}/{c.n_head_kv}x{c.head_dim} F{c.n_ff} V{c.n_vocab} "
            f"{'+'.join(kinds)}")


def candidates(t: Transformer) -> dict[str, tuple[Callable[[Transformer], Transformer], bool]]:
    return CUDA_CANDIDATES if t.device.type == "cuda" else CPU_CANDIDATES


def cache_key(t: Transformer) -> str:
    where = (f"cuda {torch.cuda.get_device_name(t.device)}" if t.device.type == "cuda"
             else f"threads {torch.get_num_threads()}")
    return (f"{cpu_engine.machine_id()} | {cpu_engine.source_hash()} | torch {torch.__version__} | "
            f"{where} | {shape_key(t)}")


def _cache_file() -> str:
    return os.path.join(cpu_engine.cache_dir(), "kernels.json")


def _read_cache() -> dict:
    try:
        with open(_cache_file()) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(key: str, entry: dict) -> None:
    data = _read_cache()
    data[key] = entry
    tmp = f"{_cache_file()}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, _cache_file())  # atomic: a concurrent writer's entry may be lost, never half a file
    except OSError as e:
        print(f"warning: cannot cache the kernel choice ({e}); it will be measured again", file=sys.stderr)


def build_candidate(t: Transformer, name: str) -> Transformer:
    """``t`` running on kernel ``name`` (ValueError for an unknown name, EngineUnavailable where it cannot run)."""
    table = candidates(t)
    if name not in table:
        raise ValueError(f"unknown kernel {name!r} for {t.device.type}; one of: {', '.join(table)}")
    return table[name][0](t)


def _logits(t: Transformer, tokens: np.ndarray) -> torch.Tensor:
    cache = t.new_cache(64)
    n = len(tokens)
    return t.forward(cache, tokens, np.arange(n), [(0,)] * n, np.ones(n, dtype=bool))


class _Timing:
    """One candidate being timed: its model, a cache with the calibration prompt, the steps so far."""

    def __init__(self, cand: Transformer, tokens: np.ndarray) -> None:
        self.cand, self.tokens = cand, tokens
        self.times: list[float] = []  # decode steps (1 token), ms
        self.batch_times: list[float] = []  # prompt / verify shapes (BATCH tokens), ms
        self.cache = cand.new_cache(32 + (BATCH + 1) * DECODE_STEPS)
        n = len(tokens)
        cand.forward(self.cache, tokens, np.arange(n), [(0,)] * n, np.arange(n) == n - 1)
        self.n_past = n

    def _timed(self, n: int) -> float:
        toks = np.resize(self.tokens, n)
        start = time.perf_counter()
        self.cand.forward(self.cache, toks, np.arange(self.n_past, self.n_past + n), [(0,)] * n,
                          np.arange(n) == n - 1)
        if self.cand.device.type == "cuda":
            torch.cuda.synchronize(self.cand.device)
        self.n_past += n
        return (time.perf_counter() - start) * 1e3

    def step(self) -> None:
        self.times.append(self._timed(1))
        self.batch_times.append(self._timed(BATCH))

    @property
    def best(self) -> float:
        """The fastest decode step after the first (a busy machine only slows a step down: the fastest is its
        cost)."""
        return min(self.times[1:] or self.times)

    @property
    def score(self) -> float:
        """What a candidate is chosen by: a decode step plus a token's share of a BATCH-token forward (prompt
        processing and speculative verification)."""
        return self.best + min(self.batch_times[1:] or self.batch_times) / BATCH


def trial(t: Transformer, name: str, reference: torch.Tensor | None, exact: bool = False,
          ) -> tuple[Trial, _Timing | None, torch.Tensor | None]:
    """Candidate ``name`` built and checked against ``reference`` (within the accuracy bound; with ``exact``, bit
    for bit); its timing is set up, not yet run. Also returns its logits on the calibration tokens."""
    result = Trial(name, invariant=candidates(t)[name][1])
    try:
        cand = build_candidate(t, name)
    except EngineUnavailable as e:
        result.problem = str(e)
        return result, None, None
    tokens = CALIBRATION % t.config.n_vocab
    logits = _logits(cand, tokens)
    if reference is not None:
        scale = float(reference.abs().max())
        result.error = float((logits - reference).abs().max()) / scale
        result.agreement = float((logits.argmax(-1) == reference.argmax(-1)).float().mean())
        if exact and result.error != 0.0:
            result.problem = f"differs from the other compiled variants (error {result.error:.2e})"
        elif not result.error <= ACCURACY_BOUND:
            result.problem = f"outside the accuracy bound (error {result.error:.3f} > {ACCURACY_BOUND})"
    return result, _Timing(cand, tokens), logits


def measure(t: Transformer, opt_in: bool = False) -> list[Trial]:
    """The candidates for the model's device checked and timed (the fastest first). Where the compiled CPU engine
    builds, only its variants run: ``pick`` never prefers torch's paths to it, and its variants must give the same
    bits (each is checked against the first; their accuracy against the dequantized model is a tested property), so
    no dequantized copy of the model is made (for a 1B model that would be gigabytes). Otherwise every candidate is
    checked against the dequantized reference. The candidates take turns, one decode step each, so a burst of load
    elsewhere on the machine falls on all of them alike; one that is five times slower than the best after three
    steps stops early."""
    has_q4 = any(lin.has_q4 for layer in t.layers for lin in (layer.qkv, layer.gate_up))
    table = candidates(t)
    names = [n for n in table if (has_q4 or not n.startswith("torch-int4")) and (opt_in or n not in OPT_IN)]
    runs: list[tuple[Trial, _Timing | None]] = []
    first: torch.Tensor | None = None
    if t.device.type == "cpu":
        for name in (n for n in names if table[n][1] and n not in OPT_IN):
            r, timing, logits = trial(t, name, first, exact=True)
            runs.append((r, timing))
            first = logits if first is None else first
        if first is not None:  # the 8-bit family: within the bound of the 16-bit logits
            runs += [trial(t, name, first)[:2] for name in names if name in OPT_IN]
    if first is None:
        reference = _logits(t.dense(), CALIBRATION % t.config.n_vocab)
        runs += [trial(t, name, reference)[:2] for name in names if name not in {r.name for r, _ in runs}]
    timed = [(r, timing) for r, timing in runs if timing is not None]
    for round_ in range(DECODE_STEPS):
        best = min((timing.best for r, timing in timed if r.eligible_to_time and timing.times), default=None)
        for _r, timing in timed:
            if round_ >= 3 and best is not None and timing.best > 5 * best:
                continue
            timing.step()
    for r, timing in timed:
        r.decode_ms = timing.best
        r.score = timing.score
        r.batch_ms = min(timing.batch_times[1:] or timing.batch_times)
    trials = [r for r, _ in runs]
    return sorted(trials, key=lambda r: (r.score is None, r.score or 0.0))


def pick(trials: list[Trial]) -> Trial:
    """The fastest batch-invariant candidate within the bound, else the fastest within the bound (never an opt-in
    one)."""
    ok = [r for r in trials if r.eligible and r.name not in OPT_IN]
    if not ok:
        raise EngineUnavailable("no CPU kernel candidate met the accuracy bound")
    invariant = [r for r in ok if r.invariant]
    return min(invariant or ok, key=lambda r: r.score if r.score is not None else r.decode_ms)  # type: ignore


def choose_kernel(t: Transformer, name: str | None = None, *, verbose: bool = False) -> Transformer:
    """``t`` on its kernel: ``name``, else ``$SAMPLECHAIN_KERNEL``, else this machine's cached or measured choice."""
    name = name or os.environ.get("SAMPLECHAIN_KERNEL") or None
    if name is not None:
        try:
            return build_candidate(t, name)
        except EngineUnavailable as e:
            raise ValueError(f"kernel {name!r} cannot run here: {e}") from None
    key = cache_key(t)
    cached = _read_cache().get(key)
    if isinstance(cached, dict) and cached.get("kernel") in candidates(t):
        try:
            return build_candidate(t, cached["kernel"])
        except EngineUnavailable:
            pass  # e.g. the compiler went away: measure again
    trials = measure(t)
    best = pick(trials)
    if not best.invariant and t.device.type == "cpu":
        print(f"warning: no compiled CPU engine here; {best.name} is not batch-invariant", file=sys.stderr)
    _write_cache(key, {"kernel": best.name, "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
                       "decode_ms": {r.name: r.decode_ms for r in trials},
                       f"batch{BATCH}_ms": {r.name: r.batch_ms for r in trials},
                       "score": {r.name: r.score for r in trials},
                       "problems": {r.name: r.problem for r in trials if r.problem}})
    if verbose:
        print(report(trials, best.name), file=sys.stderr)
    return build_candidate(t, best.name)


def report(trials: list[Trial], chosen: str) -> str:
    lines = [f"{'kernel':<16} {'decode ms':>9} {f'{BATCH}-token ms':>11} {'error':>7} {'top-1':>6}  invariant"]
    for r in trials:
        ms = f"{r.decode_ms:9.2f}" if r.decode_ms is not None else f"{'-':>9}"
        ms += f" {r.batch_ms:11.2f}" if r.batch_ms is not None else f" {'-':>11}"
        err = f"{r.error:7.3f}" if r.error is not None else f"{'-':>7}"
        agree = f"{r.agreement:6.2f}" if r.agreement is not None else f"{'-':>6}"
        mark = " <- chosen" if r.name == chosen else f"  ({r.problem})" if r.problem else ""
        lines.append(f"{r.name:<16} {ms} {err} {agree}  {'yes' if r.invariant else 'no':<9}{mark}")
    return "\n".join(lines)
