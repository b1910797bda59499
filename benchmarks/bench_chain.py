"""Median µs per token of ``chain.sample(logits)`` against llama.cpp's ``llama_sampler_apply``, same logits, warm
and cold.

What is timed: ours, ``chain.sample(x)``, which applies the chain to the logits and accepts the token (where the
chain is one fused step starting with top-k, or greedy, that is one call of the compiled step, ``csrc/sampling.c``;
otherwise the NumPy steps over ``Candidates``); llama.cpp's, its ``llama_sampler_apply`` call through
llama-cpp-python alone (filling its candidate array from Python and the accept are left out, in its favour). Both
are called from Python, each the way its users call it: ours a CPython extension function, llama.cpp's a ctypes
function, whose call costs more when the caches are cold (about 30 µs against 8 µs for an empty function on the
2-vCPU Xeon of docs/sampling.md); that difference is part of what each side's users get.
Same inputs: before each timed call, that side's input is freshly written, as it is right after a model's forward
pass (our logits buffer; llama.cpp's ``llama_token_data`` array, filled from the same logits). Both chains have the
same samplers, parameters and seeds, and the benchmark reports whether they selected the same tokens.

Two modes, both reported by default (``--mode`` picks one):

- warm: ours and llama.cpp's alternate token by token, so both see the same machine noise; whatever the other
  side's call left in the caches stays there.
- cold: as in real use, where a forward pass runs between two samplings. Before each timed call, on both sides
  alike and outside the timed region, the caches are evicted the way a forward pass evicts them: a buffer of
  ``--evict-mib`` MiB (by default three times the last-level cache, read from sysfs as ``lscpu`` reads it) is
  read from end to end, streaming every cache line of it, as the weights of a layer are streamed. Then the same
  untimed work runs before either side's call: our logits buffer is written and llama.cpp's candidate array
  filled from it (that fill runs Python, NumPy and ctypes code, so it warms a little of what either side runs
  next: both get it), and the one call is timed.
  ``--cold-repeats`` tokens (fewer than warm ones: each eviction streams the buffer once).

Run: ``make bench`` (installs llama-cpp-python), or ``python -m benchmarks.bench_chain [--mode cold]``.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import time

import numpy as np

import samplechain as sc
from benchmarks import _llama
from benchmarks.logits import realistic_logits

SEED = 1234
_CACHE_DIR = "/sys/devices/system/cpu/cpu0/cache"
_FALLBACK_LLC = 64 << 20  # when sysfs says nothing (not Linux): a large server's last-level cache


def configurations():
    yield "greedy", lambda: [sc.Greedy()]
    yield "top-k 40 + dist", lambda: [sc.TopK(40), sc.Dist(SEED)]
    yield "top-p 0.95 + dist", lambda: [sc.TopP(0.95), sc.Dist(SEED)]
    yield "min-p 0.05 + temp 0.8 + dist", lambda: [sc.MinP(0.05), sc.Temperature(0.8), sc.Dist(SEED)]
    yield "llama.cpp default chain", lambda: list(sc.CommonSampler(sc.SamplingParams(seed=SEED)).chain)


def llama_default_chain():
    """llama.cpp's default chain as common_sampler builds it, placeholders included."""
    return [sc.LogitBias(None, {}), sc.Penalties(64, 1.0, 0.0, 0.0), sc.TopNSigma(-1.0), sc.TopK(40),
            sc.Typical(1.0, 0), sc.TopP(0.95, 0), sc.MinP(0.05, 0), sc.XTC(0.0, 0.1, 0, SEED),
            sc.DynamicTemperature(0.8, 0.0, 1.0), sc.Dist(SEED)]


def last_level_cache_bytes() -> int:
    """The largest cache of cpu0 (sysfs, the source of ``lscpu``), in bytes."""
    largest = 0
    for index in glob.glob(os.path.join(_CACHE_DIR, "index*")):
        try:
            with open(os.path.join(index, "size")) as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            largest = max(largest, int(digits) * scale)
    return largest or _FALLBACK_LLC


class Evictor:
    """Streams a buffer larger than the last-level cache through the caches, as a forward pass streams weights."""

    def __init__(self, nbytes: int) -> None:
        self.buf = np.ones(max(nbytes, 1 << 20) // 8, dtype=np.float64)  # written once: every page is mapped

    def __call__(self) -> None:
        self.buf.sum()  # reads every cache line of the buffer


def bench(name, make, rows, repeats, evict=None):
    """Ours and llama.cpp's interleaved token by token; with ``evict``, the caches evicted before each timed call."""
    chain = sc.Chain(make())
    theirs_chain = None
    if _llama.available():
        theirs_chain = _llama.LlamaChain(llama_default_chain() if name == "llama.cpp default chain" else make())
    ours, theirs, same = [], [], 0
    x = np.empty_like(rows[0])  # the model's output buffer: freshly written logits, as after a forward pass
    for r in range(repeats):
        row = rows[r % len(rows)]
        if evict is not None:
            evict()
        x[:] = row
        if evict is not None and theirs_chain is not None:
            theirs_chain._fill(x)  # the untimed work before llama.cpp's call, before ours too (cold: alike)
        t0 = time.perf_counter()
        token = chain.sample(x)
        ours.append(time.perf_counter() - t0)
        if theirs_chain is not None:
            if evict is not None:
                evict()
                x[:] = row
            their_token, dt = theirs_chain.sample(x)  # fills its candidate array from x, then times the apply
            theirs.append(dt)
            same += their_token == token
    result = {"ours": statistics.median(ours) * 1e6}
    if theirs:
        result["llama"] = statistics.median(theirs) * 1e6
        result["same"] = f"{same}/{repeats}"
    return result


def _cells(r: dict) -> str:
    llama = r.get("llama")
    ratio = f"{r['ours'] / llama:6.2f}" if llama else f"{'-':>6}"
    llama_s = f"{llama:11.1f}" if llama else f"{'-':>11}"
    return f"{r['ours']:11.1f} {llama_s} {ratio} {r.get('same', '-'):>8}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("both", "warm", "cold"), default="both")
    ap.add_argument("--repeats", type=int, default=300, help="tokens per chain, warm")
    ap.add_argument("--cold-repeats", type=int, default=100, help="tokens per chain, cold")
    ap.add_argument("--evict-mib", type=int, default=None,
                    help="the buffer streamed before each cold call (default: 3 x the last-level cache)")
    ap.add_argument("--vocab", type=int, nargs="*", default=[49152, 262144])
    args = ap.parse_args()
    if not _llama.available():
        print("llama-cpp-python not installed: showing our times only (pip install -e '.[bench]')")
    evict = None
    if args.mode != "warm":
        llc = last_level_cache_bytes()
        nbytes = args.evict_mib << 20 if args.evict_mib is not None else 3 * llc
        print(f"cold: last-level cache {llc >> 20} MiB, {nbytes >> 20} MiB streamed before each timed call")
        evict = Evictor(nbytes)
    modes = [m for m in ("warm", "cold") if args.mode in (m, "both")]
    head = "".join(f" | {m + ' ours µs':>11} {m + ' llama':>11} {'ratio':>6} {'same':>8}" for m in modes)
    print(f"{'vocab':>7}  {'chain':<30}{head}")
    rng = np.random.default_rng(0)
    for n in args.vocab:
        rows = [realistic_logits(n, rng) for _ in range(32)]
        for name, make in configurations():
            for _ in range(2):  # warm-up
                sc.Chain(make()).sample(rows[0])
            cells = []
            for m in modes:
                r = bench(name, make, rows, args.repeats) if m == "warm" else bench(
                    name, make, rows, args.cold_repeats, evict)
                cells.append(f" | {_cells(r)}")
            print(f"{n:>7}  {name:<30}{''.join(cells)}", flush=True)


if __name__ == "__main__":
    main()
