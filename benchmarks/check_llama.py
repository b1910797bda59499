"""Conformance check against llama.cpp itself (needs llama-cpp-python): same logits, same seeds.

For many random chains and realistic logits, compares the surviving candidates (ids in order), their
probabilities (1e-6), and the selected tokens over several steps. Prints a summary; exits 1 on a mismatch.
"""

from __future__ import annotations

import sys

import numpy as np

import samplechain as sc
from benchmarks import _llama
from benchmarks.logits import realistic_logits


def compare(make, n_vocab: int, steps: int, seed: int) -> str | None:
    ours_chain, theirs = sc.Chain(make()), _llama.LlamaChain(make())
    rng = np.random.default_rng(seed)
    ties = 0
    for step in range(steps):
        x = realistic_logits(n_vocab, rng)
        c = sc.Candidates.from_logits(x)
        ours_chain.apply(c)
        ids, logits, p, sel, _, _ = theirs.apply(x)
        if len(ids) != len(c):
            return f"step {step}: {len(c)} candidates vs llama.cpp {len(ids)}"
        if not np.array_equal(ids, c.ids):
            # llama.cpp's sorts are unstable: equal logits may come in another order. The same logit
            # sequence means the candidates differ only among ties.
            if not np.array_equal(logits, c.logits):
                return f"step {step}: candidates differ beyond ties"
            ties += 1
        if c.probs is not None and not np.allclose(c.probs, p, atol=1e-6, rtol=0):
            return f"step {step}: probabilities differ by {np.abs(c.probs - p).max():.3g}"
        if sel != c.selected and not (ties and logits[sel] == c.logits[c.selected]):
            return f"step {step}: selected {c.selected} vs llama.cpp {sel}"
        if sel >= 0:
            ours_chain.accept(int(c.ids[c.selected]))
            theirs.accept(int(ids[sel]))
    return f"same up to the order of equal logits ({ties} of {steps} steps)" if ties else None


def chains(n_vocab: int, seed: int):
    s = seed
    yield "greedy", lambda: [sc.Greedy()]
    yield "dist", lambda: [sc.Dist(s)]
    yield "top-k 40 + dist", lambda: [sc.TopK(40), sc.Dist(s)]
    yield "top-k 1000 + dist", lambda: [sc.TopK(1000), sc.Dist(s)]
    yield "top-p 0.95 + dist", lambda: [sc.TopP(0.95), sc.Dist(s)]
    yield "top-p 0.5 min_keep 3 + dist", lambda: [sc.TopP(0.5, 3), sc.Dist(s)]
    yield "min-p 0.05 + temp 0.8 + dist", lambda: [sc.MinP(0.05), sc.Temperature(0.8), sc.Dist(s)]
    yield "typical 0.9 + dist", lambda: [sc.TopK(200), sc.Typical(0.9), sc.Dist(s)]
    yield "temp-ext dyn + dist", lambda: [sc.TopK(100), sc.DynamicTemperature(0.8, 0.5, 1.3), sc.Dist(s)]
    yield "xtc + dist", lambda: [sc.TopK(50), sc.XTC(0.7, 0.05, 1, s), sc.Dist(s)]
    yield "top-n-sigma 1.5 + dist", lambda: [sc.TopNSigma(1.5), sc.TopK(50), sc.Dist(s)]
    yield "penalties + top-k + dist", lambda: [sc.Penalties(64, 1.3, 0.2, 0.4), sc.TopK(40), sc.Dist(s)]
    yield "logit-bias + top-k + dist", lambda: [sc.LogitBias(n_vocab, {5: 30.0, 7: -np.inf}), sc.TopK(40),
                                                 sc.Dist(s)]
    yield "mirostat v1", lambda: [sc.Temperature(0.8), sc.Mirostat(n_vocab, s, 5.0, 0.1)]
    yield "mirostat v2", lambda: [sc.Temperature(0.8), sc.MirostatV2(s, 5.0, 0.1)]
    yield "adaptive-p", lambda: [sc.TopK(100), sc.AdaptiveP(0.4, 0.9, s)]
    yield "default chain", lambda: list(sc.CommonSampler(sc.SamplingParams(seed=s)).chain)


def main() -> int:
    if not _llama.available():
        print("llama-cpp-python is not installed: pip install -e '.[bench]'")
        return 1
    failures = 0
    for n_vocab in (49152, 262144):
        for name, make in chains(n_vocab, 1234):
            steps = 6 if "mirostat" in name or "typical" in name else 12
            err = compare(make, n_vocab, steps, seed=7)
            failed = err is not None and not err.startswith("same")
            failures += failed
            print(f"{n_vocab:>7}  {name:<32} {'same' if err is None else err if not failed else 'DIFFERENT: ' + err}")
    print(f"{failures} chain(s) differ from llama.cpp")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
