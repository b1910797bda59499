"""Median µs per token of ``chain.sample(logits)`` against llama.cpp's ``llama_sampler_apply``, same logits.

Ours includes building the candidates from the logits and accepting the token; llama.cpp's figure is its
apply call alone (filling its candidate array from Python is left out). Before each call, both inputs are
freshly written (our logits buffer, llama.cpp's candidate array), as they are right after a model's forward.
Both use the same seeds, and the benchmark reports whether they selected the same tokens.
Run: ``make bench`` (installs llama-cpp-python).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import samplechain as sc
from benchmarks import _llama
from benchmarks.logits import realistic_logits

SEED = 1234


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


def bench(name, make, rows, repeats):
    """Ours and llama.cpp's interleaved token by token, so both see the same machine noise."""
    chain = sc.Chain(make())
    theirs_chain = None
    if _llama.available():
        theirs_chain = _llama.LlamaChain(llama_default_chain() if name == "llama.cpp default chain" else make())
    ours, theirs, same = [], [], 0
    x = np.empty_like(rows[0])  # the model's output buffer: freshly written logits, as after a forward pass
    for r in range(repeats):
        x[:] = rows[r % len(rows)]
        t0 = time.perf_counter()
        token = chain.sample(x)
        ours.append(time.perf_counter() - t0)
        if theirs_chain is not None:
            their_token, dt = theirs_chain.sample(x)
            theirs.append(dt)
            same += their_token == token
    result = {"name": name, "ours": statistics.median(ours) * 1e6}
    if theirs:
        result["llama"] = statistics.median(theirs) * 1e6
        result["same"] = f"{same}/{repeats}"
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--vocab", type=int, nargs="*", default=[49152, 262144])
    args = ap.parse_args()
    if not _llama.available():
        print("llama-cpp-python not installed: showing our times only (pip install -e '.[bench]')")
    rng = np.random.default_rng(0)
    print(f"{'vocab':>7}  {'chain':<30} {'ours µs':>9} {'llama.cpp µs':>13} {'ratio':>6}  same tokens")
    for n in args.vocab:
        rows = [realistic_logits(n, rng) for _ in range(32)]
        for name, make in configurations():
            for _ in range(2):  # warm-up
                sc.Chain(make()).sample(rows[0])
            r = bench(name, make, rows, args.repeats)
            llama = r.get("llama")
            ratio = f"{r['ours'] / llama:6.2f}" if llama else "     -"
            llama_s = f"{llama:13.1f}" if llama else f"{'-':>13}"
            print(f"{n:>7}  {name:<30} {r['ours']:9.1f} {llama_s} {ratio}  {r.get('same', '-')}", flush=True)


if __name__ == "__main__":
    main()
