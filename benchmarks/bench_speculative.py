"""Speculative decoding: n-gram drafting against plain decoding, and against llama.cpp's prompt lookup
(llama-cpp-python's ``LlamaPromptLookupDecoding``) on the same GGUF, 2 threads, same run.

Four tasks: copy a paragraph, edit code and print it, summarise with quotes, an open story; greedy decoding of
``--n`` tokens. For each: plain and drafted decode tok/s (from the first generated token on, as llama.cpp's side
is timed) and the speed-up, the acceptance rate, and whether the text is
identical with and without drafting (ours: always, by batch-invariant logits; llama.cpp: often not).
Run: ``python -m benchmarks.bench_speculative`` (needs llama-cpp-python: ``make bench`` installs it).
"""

from __future__ import annotations

import argparse
import time

import torch

from samplechain import SamplingParams
from samplechain.runtime import load_model, model_path
from samplechain.runtime.speculation import Speculation
from samplechain.speculative.ngram import make_drafters

PARA = ("The ocean covers seventy percent of the planet. Its currents move heat from the equator to the poles, and "
        "its depths store carbon for centuries. Without it, the weather of every continent would be different, "
        "and the air itself would hold far less oxygen. Every second breath we take comes from the sea.")
CODE = ("def mean(values):\n    total = 0\n    for v in values:\n        total += v\n"
        "    return total / len(vaules)\n\n\n"
        "def variance(values):\n    m = mean(values)\n    return sum((v - m) ** 2 for v in values) / len(values)\n\n\n"
        "def stdev(values):\n    return variance(values) ** 0.5\n")
TASKS = {
    "copy": f"Text: {PARA}\n\nThe same text, copied exactly:\n\nText: The ocean",
    "code": f"# buggy version\n{CODE}\n\n# fixed version (only `vaules` changed to `values`)\ndef mean(values):\n",
    "quotes": f"Summarize this text, quoting its key sentences word for word:\n\n{PARA}\n\nSummary:",
    "story": "Once upon a time, in a lighthouse at the edge of the world,",
}


def _decode_rate(model, n_tokens):
    """Generated tokens per second of decoding (forwards and sampling after the prompt), as llama.cpp's is timed
    from its first generated token."""
    t = model.timings
    return 1e3 * (n_tokens - 1) / (t.eval_ms + t.sample_ms)


def ours(model, prompt, n, drafters):
    params = SamplingParams(temperature=0.0)
    model.generate(prompt, params, n_predict=4)  # warm
    plain = "".join(model.generate(prompt, params, n_predict=n))
    n_tok = model.timings.n_sample
    r_plain = _decode_rate(model, n_tok)
    spec = Speculation(drafters())
    fast = "".join(model.generate(prompt, params, n_predict=n, speculation=spec))
    r_spec = _decode_rate(model, n_tok)
    drafted = sum(s.drafted for s in spec.stats.values())
    accepted = sum(s.accepted for s in spec.stats.values())
    return r_plain, r_spec, accepted / max(drafted, 1), drafted, fast == plain


def llama_cpp(path, prompt_tokens, n, k):
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from benchmarks import _llama

    _llama.without_extra_bufts()

    def run(draft):
        llm = llama_cpp.Llama(path, n_threads=2, n_threads_batch=2, n_ctx=2048, verbose=False, logits_all=True,
                              draft_model=draft)
        toks = []
        t0 = None
        for tok in llm.generate(prompt_tokens, temp=0.0, top_k=1, reset=True):
            if t0 is None:
                t0 = time.perf_counter()
            toks.append(tok)
            if len(toks) > n or tok == llm.token_eos():
                break
        return toks, (len(toks) - 1) / (time.perf_counter() - t0)

    plain, r_plain = run(None)
    fast, r_fast = run(LlamaPromptLookupDecoding(num_pred_tokens=k))
    return r_plain, r_fast, fast == plain


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=128, help="tokens to generate per task")
    parser.add_argument("--k", type=int, default=10, help="llama.cpp prompt lookup: tokens per draft")
    parser.add_argument("--no-llama", action="store_true", help="skip llama.cpp")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model = load_model(n_threads=2)

    def drafters():
        return make_drafters(["ngram-simple,ngram-map-k"], ngram_simple_size_n=3, ngram_simple_size_m=16,
                             ngram_map_k_size_n=2, ngram_map_k_size_m=16)

    print(f"SmolLM2-135M Q4_1, kernel {model.transformer.kernel}, greedy, {args.n} tokens; ours: ngram-simple (n 3, "
          f"m 16) then ngram-map-k (n 2, m 16), adaptive length; llama.cpp: prompt lookup, {args.k} tokens")
    print(f"{'task':<8} {'plain':>7} {'drafted':>8} {'speedup':>8} {'accept':>7} {'same':>5} | "
          f"{'llama.cpp':>9} {'lookup':>7} {'speedup':>8} {'same':>5}")
    for name, prompt in TASKS.items():
        p, f, acc, _drafted, same = ours(model, prompt, args.n, drafters)
        line = f"{name:<8} {p:7.1f} {f:8.1f} {f / p:7.2f}x {100 * acc:6.1f}% {same!s:>5} |"
        if not args.no_llama:
            lp, lf, lsame = llama_cpp(model_path(), model.tokenize(prompt), args.n, args.k)
            line += f" {lp:9.1f} {lf:7.1f} {lf / lp:7.2f}x {lsame!s:>5}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
