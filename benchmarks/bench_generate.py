"""Prompt processing and decode tokens/s: our runtime against its anchor on the same GGUF, in the same run.

CPU (default): against llama.cpp (llama-cpp-python), 2 threads each, the same prompt tokens and sampling parameters
(llama.cpp's default chain, seed 1234). Decode is timed over ``--n`` generated tokens (EOS ignored); prompt
processing over a ``--prompt-tokens`` batch. Also reported: the kernel the runtime chose (and every candidate's
measured decode step), load time, sampling's share of a decode step, and whether logits are batch-invariant.
``--device cuda``: single-stream decode (CUDA graphs and eager) and ``--batch`` sequences decoding together
(aggregate tok/s), against transformers on the same GGUF and GPU (greedy, fp32).
Run: ``make bench`` (installs llama-cpp-python), or ``python -m benchmarks.bench_generate --gemma``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from samplechain import SamplingParams
from samplechain.runtime import Context, load_model, model_path
from samplechain.runtime import kernels as K

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


def invariant(model, tokens):
    """Every row of a 3-sequence batch bitwise equal to the same tokens decoded one at a time."""
    t = model.transformer
    tokens = tokens[:12]
    ctx = Context(t, 256)
    alone = torch.stack([ctx.decode([tok])[-1] for tok in tokens])
    ctx = Context(t, 256, n_seq_max=3)
    rows = []
    for i, tok in enumerate(tokens):
        logits = ctx.decode([tokens[-1 - i], tok, tokens[i // 2]], positions=[i, i, i], seq_ids=[1, 0, 2],
                            outputs=[True] * 3)
        rows.append(logits[1])
    return bool(torch.equal(torch.stack(rows), alone))


def llama_cpp(path, tokens, n_decode, repeats):
    import llama_cpp

    from benchmarks import _llama

    _llama.without_extra_bufts()

    start = time.perf_counter()
    llm = llama_cpp.Llama(path, n_threads=2, n_threads_batch=2, n_ctx=max(1024, len(tokens) + n_decode + 8),
                          n_batch=512, verbose=False)
    load_s = time.perf_counter() - start
    return load_s, *llama_rates(llm, tokens, n_decode, repeats)


def llama_rates(llm, tokens, n_decode, repeats):
    """llama.cpp's median prompt tok/s (``tokens`` in one batch) and decode tok/s over ``repeats`` runs."""
    pp, tg = [], []
    for _ in range(repeats):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(tokens)
        pp.append(len(tokens) / (time.perf_counter() - t0))
        tg.append(llama_decode_rate(llm, tokens, n_decode))
    return statistics.median(pp), statistics.median(tg)


def llama_decode_rate(llm, tokens, n_decode):
    """llama.cpp's decode tok/s over ``n_decode`` tokens after an 8-token prompt, its default sampler chain."""
    llm.reset()
    n = 0
    t0 = None
    for _ in llm.generate(tokens[:8], top_k=40, top_p=0.95, min_p=0.05, temp=0.8, repeat_penalty=1.0, reset=True):
        if t0 is None:  # the first token comes out of prompt processing
            t0 = time.perf_counter()
        n += 1
        if n > n_decode:
            break
    return (n - 1) / (time.perf_counter() - t0)


def cpu(args):
    names = ["smollm2"] + (["gemma3-270m"] if args.gemma else [])
    print(f"{'model':>12}  {'what':<22} {'ours':>9} {'llama.cpp':>10} {'ratio':>6}")
    for name in names:
        model, load_s, pp, tg, share, tokens = ours(name, args.prompt_tokens, args.n, args.repeats)
        l_load, l_pp, l_tg = llama_cpp(model_path(name), tokens, args.n, args.repeats)
        print(f"{name:>12}  {'load s':<22} {load_s:9.2f} {l_load:10.2f} {load_s / l_load:6.2f}")
        print(f"{name:>12}  {'prompt tok/s':<22} {pp:9.1f} {l_pp:10.1f} {pp / l_pp:6.2f}")
        print(f"{name:>12}  {'decode tok/s':<22} {tg:9.1f} {l_tg:10.1f} {tg / l_tg:6.2f}")
        print(f"{name:>12}  {'sampling share':<22} {100 * share:8.1f}%")
        print(f"{name:>12}  {'kernel':<22} {model.transformer.kernel:>9}")
        print(f"{name:>12}  {'batch-invariant':<22} {'yes' if invariant(model, tokens) else 'NO':>9}")
        if args.candidates:
            trials = K.measure(model.transformer)
            print(K.report(trials, K.pick(trials).name))


# --- CUDA ---------------------------------------------------------------------------------------------------------

def _sync():
    torch.cuda.synchronize()


def cuda_single(model, tokens, n_decode):
    """Single-stream generation with the default chain (sampled on the CPU), tok/s over the decode steps."""
    params = SamplingParams(seed=1234, ignore_eos=True)
    for _ in model.generate(tokens[:8], params, n_predict=8):
        pass  # graphs captured, cuBLAS warm
    rates = []
    for _ in range(3):
        for _ in model.generate(tokens[:8], params, n_predict=n_decode):
            pass
        t = model.timings
        rates.append(1e3 * t.n_eval / (t.eval_ms + t.sample_ms))
    return statistics.median(rates)


def cuda_batch(model, tokens, batch, n_decode):
    """`batch` sequences decoding together, greedy on the GPU: aggregate tok/s of the decode steps."""
    n_prompt = 8
    ctx = model.new_context(batch * (n_prompt + n_decode + 2), n_seq_max=batch)
    ctx.decode(np.tile(tokens[:n_prompt], batch), positions=np.tile(np.arange(n_prompt), batch),
               seq_ids=np.repeat(np.arange(batch), n_prompt).tolist(), outputs=[False] * (batch * n_prompt))
    nxt = [tokens[n_prompt]] * batch
    seqs = list(range(batch))
    times = []
    for step in range(n_decode):
        _sync()
        t0 = time.perf_counter()
        logits = ctx.decode(nxt, positions=[n_prompt + step] * batch, seq_ids=seqs, outputs=[True] * batch)
        nxt = logits.argmax(-1).tolist()
        times.append(time.perf_counter() - t0)
    return batch / statistics.median(times[2:])


def transformers_anchor(tokens, batch, n_decode):
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        return None, None
    import os

    folder, file = os.path.split(model_path("smollm2"))
    hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32).cuda().eval()
    rates = []
    for b in (1, batch):
        ids = torch.tensor([tokens[:8]] * b, device="cuda")
        hf.generate(ids, max_new_tokens=4, do_sample=False, min_new_tokens=4)
        _sync()
        t0 = time.perf_counter()
        hf.generate(ids, max_new_tokens=n_decode, min_new_tokens=n_decode, do_sample=False)
        _sync()
        rates.append(b * n_decode / (time.perf_counter() - t0))
    return rates[0], rates[1]


def cuda(args):
    kernels = ["cuda-graph-tf32", "cuda-graph", "cuda-eager"]
    models = {k: load_model(device="cuda", kernel=k) for k in kernels}
    tokens = models[kernels[0]].tokenize(TEXT * 4)
    hf1, hfb = transformers_anchor(tokens, args.batch, args.n)
    single = {k: cuda_single(m, tokens, args.n) for k, m in models.items()}
    batched = {k: cuda_batch(m, tokens, args.batch, args.n) for k, m in models.items()}
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, SmolLM2-135M (fp32 weights)")
    print(f"{'what':<22} " + " ".join(f"{k:>15}" for k in kernels) + f" {'transformers':>12} {'ratio':>6}")
    for what, row, hf in (("single stream tok/s", single, hf1), (f"{args.batch} sequences tok/s", batched, hfb)):
        best = max(row.values())
        ratio = f"{best / hf:6.1f}" if hf else f"{'-':>6}"
        hf_s = f"{hf:12.1f}" if hf else f"{'n/a':>12}"
        print(f"{what:<22} " + " ".join(f"{row[k]:15.1f}" for k in kernels) + f" {hf_s} {ratio}")
    trials = K.measure(models[kernels[0]].transformer)
    print(K.report(trials, K.pick(trials).name))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=64, help="tokens to decode")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gemma", action="store_true", help="also Gemma 3 270M (262k vocabulary)")
    parser.add_argument("--candidates", action="store_true", help="time every kernel candidate too")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch", type=int, default=64, help="sequences decoding together (cuda)")
    args = parser.parse_args()
    if args.device == "cuda":
        cuda(args)
    else:
        torch.set_num_threads(2)
        cpu(args)


if __name__ == "__main__":
    main()
