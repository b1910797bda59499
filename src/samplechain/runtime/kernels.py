"""Which forward a model runs on this machine, chosen by timing, never from a CPU flag.

On CUDA the candidates are ``cuda-graph`` (decode steps replayed as CUDA graphs, float32), ``cuda-graph-tf32`` (the
same with TF32 matrix products) and ``cuda-eager``.

Candidates on the CPU: the compiled engine's kernel variants (``c-amx``: AMX tile products for several tokens, the
AVX-512 code for one; ``c-avx512vnni``, ``c-avx2``, ``c-generic``: the same bits, batch-invariant) and torch's paths
(``torch-int4-f32``, ``torch-int4-bf16``: torch's int4 kernel with float32 or bfloat16 activations; ``torch-dense``:
the dequantized reference). At first use for a machine and a model's matrices
(their shapes and weight kinds: models that share them share the choice) the compiled engine's variants this CPU can
run are checked to give the same bits and timed in two rounds on the model's real shapes: a quick one (a few decode
steps each) drops every candidate that cannot come within ``PRUNE`` of the best, the rest take turns at a decode step
and a ``BATCH``-token forward until one is left or ``ROUNDS`` are done, and the fastest is kept. torch's paths are
measured, against the dequantized reference, only when no compiled engine can be built. One line on stderr says that
this runs and what it chose. The choice is cached in ``<cache dir>/kernels.json``; ``SAMPLECHAIN_KERNEL=name``
overrides it.

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
CHECK = 2  # the compiled 16-bit variants are compared bit for bit on this many tokens (their multi-token paths run)
BATCH = 32  # a prompt chunk's shape: at 8 tokens AMX tiles barely start (AMX_MIN); c-amx lost to c-avx512vnni
QUICK_STEPS = 3  # round 1: decode steps per candidate (the first is a warm-up)
ROUNDS = 5  # round 2: at most this many turns of a decode step and a BATCH-token forward per candidate
PRUNE = 1.5  # a candidate slower than this times the best is dropped: it cannot win, and timing it costs the most
OPT_IN = {"c-avx2-q8"}  # other numerics than the 16-bit family: chosen by name only
# Decode steps within this fraction of the fastest count as the fastest: they are one speed under the timing noise
# (on a 2-vCPU Xeon c-amx and c-avx512vnni decoded the 1B shape in 36.0 and 35.3 ms, and c-amx's step measured
# 2.5 ms slower, 9 %, flipped the choice to the one whose prompts were 35-60 % slower).
DECODE_TIE = 0.10


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
    "c-amx": (_c("amx"), True),
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
    pruned: bool = False  # dropped after the quick round: slower than PRUNE times the best

    @property
    def eligible(self) -> bool:
        return self.problem is None and self.decode_ms is not None and not self.pruned


def shape_key(t: Transformer) -> str:
    """What the kernels' speed depends on: the layer count and each matrix's shape and weight kinds (the variants
    differ only in the matrix products), so models that share their matrices share a choice whatever their names."""
    roles = {role: [getattr(layer, role) for layer in t.layers] for role in ("qkv", "wo", "gate_up", "down")}
    roles["output"] = [t.output]
    mats = [f"{role} {lins[0].shape[0]}x{lins[0].shape[1]} {'/'.join(sorted({lin.form for lin in lins}))}"
            for role, lins in roles.items()]
    return f"L{t.config.n_layer} " + ", ".join(mats)


def candidates(t: Transformer) -> dict[str, tuple[Callable[[Transformer], Transformer], bool]]:
    return CUDA_CANDIDATES if t.device.type == "cuda" else CPU_CANDIDATES


def cache_key(t: Transformer) -> str:
    where = (f"cuda {torch.cuda.get_device_name(t.device)}" if t.device.type == "cuda"
             else f"threads {torch.get_num_threads()}")
    return (f"{cpu_engine.machine_id()} | {cpu_engine.source_hash()} | torch {torch.__version__} | "
            f"{where} | batch {BATCH} | {shape_key(t)}")


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


def _forward_timer(cand: Transformer, tokens: np.ndarray) -> Callable[[int], float]:
    """A function that runs a forward of ``n`` tokens on ``cand`` (one sequence, continued in a cache of its own) and
    returns its time in ms."""
    cache = cand.new_cache(QUICK_STEPS + (ROUNDS + 1) * (BATCH + 1))
    n_past = 0

    def run(n: int) -> float:
        nonlocal n_past
        toks = np.resize(tokens, n)
        start = time.perf_counter()
        cand.forward(cache, toks, np.arange(n_past, n_past + n), [(0,)] * n, np.arange(n) == n - 1)
        if cand.device.type == "cuda":
            torch.cuda.synchronize(cand.device)
        n_past += n
        return (time.perf_counter() - start) * 1e3

    return run


class _Timing:
    """One candidate's times (ms) of decode steps and BATCH-token forwards, each run by ``run(n_tokens)``."""

    def __init__(self, run: Callable[[int], float]) -> None:
        self.run = run
        self.times: list[float] = []  # decode steps (1 token)
        self.batch_times: list[float] = []  # prompt / verify shapes (BATCH tokens)

    def decode(self) -> None:
        self.times.append(self.run(1))

    def batch(self) -> None:
        self.batch_times.append(self.run(BATCH))

    def step(self) -> None:
        self.decode()
        self.batch()

    @property
    def best(self) -> float:
        """The fastest decode step after the first (a busy machine only slows a step down: the fastest is its
        cost)."""
        return min(self.times[1:] or self.times)

    @property
    def batch_best(self) -> float | None:
        return min(self.batch_times[1:] or self.batch_times) if self.batch_times else None

    @property
    def score(self) -> float | None:
        """What a candidate is chosen by: a decode step plus a token's share of a BATCH-token forward (prompt
        processing and speculative verification)."""
        batch = self.batch_best
        return None if batch is None else self.best + batch / BATCH


def race(timings: dict[str, _Timing], pickable: set[str]) -> set[str]:
    """Time the candidates in two rounds; returns those dropped after the first. Round 1: QUICK_STEPS decode steps
    each, in turns (a burst of load elsewhere falls on all alike); the fastest pickable one's BATCH-token forward
    gives its score, and a candidate whose decode step alone exceeds PRUNE times that score is dropped (its score,
    at least its decode step, cannot come within PRUNE of the best). Round 2: the rest take turns at a decode step
    and a BATCH-token forward; from the second turn on, one whose score exceeds PRUNE times the best pickable score
    stops, and the race ends when one is left or after ROUNDS turns. Only ``pickable`` candidates set the bar."""
    for _ in range(QUICK_STEPS):
        for timing in timings.values():
            timing.decode()
    lead = min((n for n in timings if n in pickable), key=lambda n: timings[n].best, default=None)
    if lead is None:
        return set()
    timings[lead].batch()
    bar = PRUNE * timings[lead].score  # type: ignore[operator]
    pruned = {n for n, timing in timings.items() if timing.best > bar}
    left = [n for n in timings if n not in pruned]
    for turn in range(ROUNDS):
        if len(left) < 2:
            break
        for name in left:
            timings[name].step()
        if turn >= 1:
            best = min(timings[n].score for n in left if n in pickable)  # type: ignore[type-var]
            left = [n for n in left if timings[n].score <= PRUNE * best]  # type: ignore[operator]
    return pruned


def _check(result: Trial, logits: torch.Tensor, reference: torch.Tensor, exact: bool) -> None:
    """Record how far ``logits`` are from ``reference`` (as a fraction of its largest |logit|) and top-1 agreement; a
    problem where they are outside the accuracy bound or, with ``exact``, not the same bits."""
    scale = float(reference.abs().max())
    result.error = float((logits - reference).abs().max()) / scale
    result.agreement = float((logits.argmax(-1) == reference.argmax(-1)).float().mean())
    if exact and result.error != 0.0:
        result.problem = f"differs from the other compiled variants (error {result.error:.2e})"
    elif not result.error <= ACCURACY_BOUND:
        result.problem = f"outside the accuracy bound (error {result.error:.3f} > {ACCURACY_BOUND})"


def measure(t: Transformer, opt_in: bool = False) -> list[Trial]:
    """The candidates for the model's device checked and timed by ``race`` (the fastest first). Where the compiled
    CPU engine builds, only its variants run: ``pick`` never prefers torch's paths to it, and its variants must give
    the same bits (each is checked against the first on CHECK calibration tokens; their accuracy against the
    dequantized model is a tested property), so no dequantized copy of the model is made (for a 1B model that would
    be gigabytes). Opt-in variants are checked on the calibration tokens against the 16-bit logits; without a
    compiled engine every candidate is checked against the dequantized reference."""
    has_q4 = any(lin.has_q4 for layer in t.layers for lin in (layer.qkv, layer.gate_up))
    table = candidates(t)
    names = [n for n in table if (has_q4 or not n.startswith("torch-int4")) and (opt_in or n not in OPT_IN)]
    tokens = CALIBRATION % t.config.n_vocab
    trials: dict[str, Trial] = {}
    timings: dict[str, _Timing] = {}

    def add(name: str, reference: torch.Tensor | None, n_check: int, exact: bool = False) -> torch.Tensor | None:
        """Candidate ``name`` built, checked on ``n_check`` calibration tokens and set up for timing; its logits."""
        r = trials[name] = Trial(name, invariant=table[name][1])
        try:
            cand = build_candidate(t, name)
        except EngineUnavailable as e:
            r.problem = str(e)
            return None
        logits = _logits(cand, tokens[:n_check])
        if reference is not None:
            _check(r, logits, reference, exact)
        if r.problem is None:
            timings[name] = _Timing(_forward_timer(cand, tokens))
        return logits

    first: str | None = None
    if t.device.type == "cpu":
        first_logits: torch.Tensor | None = None
        for name in (n for n in names if table[n][1] and n not in OPT_IN):
            logits = add(name, first_logits, CHECK, exact=True)
            if first is None and logits is not None:
                first, first_logits = name, logits
        if first is not None and OPT_IN & set(names):  # the 8-bit family: within the bound of the 16-bit logits
            reference = _logits(build_candidate(t, first), tokens)
            for name in (n for n in names if n in OPT_IN):
                add(name, reference, len(tokens))
    if first is None:
        reference = _logits(t.dense(), tokens)
        for name in (n for n in names if n not in trials):
            add(name, reference, len(tokens))
    pruned = race(timings, {n for n in timings if n not in OPT_IN})
    for name, timing in timings.items():
        r = trials[name]
        r.decode_ms, r.batch_ms, r.score, r.pruned = timing.best, timing.batch_best, timing.score, name in pruned
    return sorted(trials.values(), key=lambda r: (r.decode_ms is None, r.score is None, r.score or r.decode_ms or 0.0))


def pick(trials: list[Trial]) -> Trial:
    """The fastest batch-invariant candidate within the bound, else the fastest within the bound (never an opt-in
    one), by its score, with decode steps within DECODE_TIE of the fastest counted as the fastest."""
    ok = [r for r in trials if r.eligible and r.name not in OPT_IN]
    if not ok:
        raise EngineUnavailable("no CPU kernel candidate met the accuracy bound")
    pool = [r for r in ok if r.invariant] or ok
    fastest = min(r.decode_ms for r in pool)  # type: ignore[type-var]

    def key(r: Trial) -> float:
        if r.score is None or r.batch_ms is None:
            return r.decode_ms  # type: ignore[return-value]
        decode = fastest if r.decode_ms <= fastest * (1 + DECODE_TIE) else r.decode_ms  # type: ignore[operator]
        return decode + r.batch_ms / BATCH  # type: ignore[operator]

    return min(pool, key=key)


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
    trials, best = _measure_saying_so(t)
    if not best.invariant and t.device.type == "cpu":
        print(f"warning: no compiled CPU engine here; {best.name} is not batch-invariant", file=sys.stderr)
    _write_cache(key, {"kernel": best.name, "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
                       "decode_ms": {r.name: r.decode_ms for r in trials},
                       f"batch{BATCH}_ms": {r.name: r.batch_ms for r in trials},
                       "score": {r.name: r.score for r in trials},
                       "problems": {r.name: r.problem for r in trials if r.problem},
                       "pruned": sorted(r.name for r in trials if r.pruned)})
    if verbose:
        print(report(trials, best.name), file=sys.stderr)
    return build_candidate(t, best.name)


def _measure_saying_so(t: Transformer) -> tuple[list[Trial], Trial]:
    """``measure`` and ``pick``, with one line on stderr: that it runs (it can take seconds), then what it chose."""
    if t.device.type == "cpu":
        try:
            cpu_engine.library()  # a first compile of the engine says so on its own line, before ours
        except EngineUnavailable:
            pass  # measured on torch's paths
    start = time.perf_counter()
    where = "CUDA" if t.device.type == "cuda" else "CPU"
    print(f"measuring {where} kernels for this model (once per machine) ...", end="", file=sys.stderr, flush=True)
    outcome = " failed"
    try:
        trials = measure(t)
        best = pick(trials)
        outcome = f" {best.name} ({best.decode_ms:.1f} ms/step; {time.perf_counter() - start:.1f} s)"
    finally:
        print(outcome, file=sys.stderr, flush=True)
    return trials, best


def report(trials: list[Trial], chosen: str) -> str:
    lines = [f"{'kernel':<16} {'decode ms':>9} {f'{BATCH}-token ms':>11} {'error':>7} {'top-1':>6}  invariant"]
    for r in trials:
        ms = f"{r.decode_ms:9.2f}" if r.decode_ms is not None else f"{'-':>9}"
        ms += f" {r.batch_ms:11.2f}" if r.batch_ms is not None else f" {'-':>11}"
        err = f"{r.error:7.3f}" if r.error is not None else f"{'-':>7}"
        agree = f"{r.agreement:6.2f}" if r.agreement is not None else f"{'-':>6}"
        mark = (" <- chosen" if r.name == chosen else f"  ({r.problem})" if r.problem
                else f"  (over {PRUNE}x the best in the quick round)" if r.pruned else "")
        lines.append(f"{r.name:<16} {ms} {err} {agree}  {'yes' if r.invariant else 'no':<9}{mark}")
    return "\n".join(lines)
