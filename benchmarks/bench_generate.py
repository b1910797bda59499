"""Prompt processing and decode tokens/s: our runtime against llama.cpp (llama-cpp-python) on the same GGUF.

Same machine, same run, 2 threads each, the same prompt tokens and the same sampling parameters (llama.cpp's
default chain, seed 1234). Decode is timed over ``--n`` generated tokens (EOS ignored); prompt processing over a
``--prompt-tokens`` batch. Also reported: load time, and sampling's share of our decode step.
Run: ``make bench`` (installs llama-cpp-python), or ``python -m benchmarks.bench_generate --gemma``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from samplechain import SamplingParams
from samplechain.runtime import load_model, model_path

TEXT = ("The history of the ocean is the history of the planet: its currents carry heat from the equator to the "
        "poles, its depths store carbon for centuries, and its surface sets the weather of every continent. ")


def ours(name, prompt_tokens, n_decode, repeats):
    start = time.perf_counter()
    model = load_model(name, n_threads=2)
    load_s = time.perf_counter() - start
    tokens = model.tokenize(TEXT * 40)[:prompt_tokens]
    pp, tg, share = [], [], []
    params = SamplingParams(seed=1234, ignore_eos=True)
    for _ in range(repeats):
        ctx = model.new_context(max(1024, prompt_tokens + n_decode + 8))
        t0 = time.perf_counter()
        ctx.decode(tokens)
        pp.append(prompt_tokens / (time.perf_counter() - t0))
        for _ in model.generate(tokens[:8], params, n_predict=n_decode):
            pass
        t = model.timings
        tg.append(1e3 * t.n_eval / t.eval_ms)
        share.append(t.sample_ms / t.n_sample / (t.eval_ms / t.n_eval + t.sample_ms / t.n_sample))
    return model, load_s, statistics.median(pp), statistics.median(tg), statistics.median(share), tokens


def llama_cpp(path, tokens, n_decode, repeats):
    import llama_cpp

    start = time.perf_counter()
    llm = llama_cpp.Llama(path, n_threads=2, n_threads_batch=2, n_ctx=max(1024, len(tokens) + n_decode + 8),
                          n_batch=512, verbose=False, use_extra_bufts=False)
    load_s = time.perf_counter() - start
    pp, tg = [], []
    for _ in range(repeats):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(tokens)
        pp.append(len(tokens) / (time.perf_counter() - t0))
        llm.reset()
        n = 0
        t0 = None
        for _ in llm.generate(tokens[:8], top_k=40, top_p=0.95, min_p=0.05, temp=0.8, repeat_penalty=1.0,
                              reset=True):
            if t0 is None:  # the first token comes out of prompt processing
                t0 = time.perf_counter()
            n += 1
            if n > n_decode:
                break
        tg.append((n - 1) / (time.perf_counter() - t0))
    return load_s, statistics.median(pp), statistics.median(tg)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=64, help="tokens to decode")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gemma", action="store_true", help="also Gemma 3 270M (262k vocabulary)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    names = ["smollm2"] + (["gemma3-270m"] if args.gemma else [])
    print(f"{'model':>12}  {'what':<18} {'ours':>9} {'llama.cpp':>10} {'ratio':>6}")
    for name in names:
        _model, load_s, pp, tg, share, tokens = ours(name, args.prompt_tokens, args.n, args.repeats)
        l_load, l_pp, l_tg = llama_cpp(model_path(name), tokens, args.n, args.repeats)
        print(f"{name:>12}  {'load s':<18} {load_s:9.2f} {l_load:10.2f} {load_s / l_load:6.2f}")
        print(f"{name:>12}  {'prompt tok/s':<18} {pp:9.1f} {l_pp:10.1f} {pp / l_pp:6.2f}")
        print(f"{name:>12}  {'decode tok/s':<18} {tg:9.1f} {l_tg:10.1f} {tg / l_tg:6.2f}")
        print(f"{name:>12}  {'sampling share':<18} {100 * share:8.1f}%")


if __name__ == "__main__":
    main()
