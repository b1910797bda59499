"""Batched device sampling: ms per step for B rows, ours against a plain PyTorch sort-based sampler and against
B sequential CPU chains, on the same logits and in the same run (ratios; absolute times drift on shared machines).

- ``ours``: ``BatchSampler`` with llama.cpp's default chain per row (top-k 40, top-p 0.95, min-p 0.05, temp 0.8,
  dist), each row its own seed, the token accepted into its chain; exact: the CPU chains' tokens.
- ``sort``: the common PyTorch top-k/top-p sampler (full descending sort, masks, softmax, exponential race),
  same parameters (not llama.cpp's semantics; the usual baseline, as in vLLM).
- ``cpu``: ``CommonSampler.sample`` row after row (NumPy).
- ``eager`` (CUDA): ``ours`` with ``cuda_graph=False``, the step launched op by op (``ours`` replays it as one
  CUDA graph, the default); ``same`` its exactness.
- ``flashinfer``: ``top_k_top_p_sampling_from_logits`` when CUDA and flashinfer are present. It gets the
  temperature-scaled logits and top-k 40, top-p 0.95 (ours also applies min-p 0.05 and keeps llama.cpp's exact
  draws).
- ``ops`` / ``syncs``: per step of ``ours``, the aten operations dispatched (torch.profiler, nested ones not
  counted) and the host synchronisations (the step's one transfer plus any ``.item()``-like read; on CUDA the
  runtime's synchronising calls); ``kern``: CUDA kernels per step (on CUDA the step replays a CUDA graph).

Run: ``python -m benchmarks.bench_device [--device cuda] [--quick]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from benchmarks.logits import realistic_logits
from samplechain import CommonSampler, SamplingParams
from samplechain.device import BatchSampler, step_counts
from samplechain.device.profile import kernel_table

TOP_K, TOP_P, TEMP = 40, 0.95, 0.8


def sort_baseline(logits: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """The usual PyTorch top-k/top-p sampler: sort, mask, softmax, exponential race."""
    x = logits / TEMP
    v, idx = x.sort(dim=1, descending=True)
    v[:, TOP_K:] = float("-inf")
    p = v.softmax(dim=1)
    drop = p.cumsum(dim=1) - p > TOP_P
    v = v.masked_fill(drop, float("-inf"))
    q = torch.empty_like(v).exponential_(generator=gen)
    return idx.gather(1, (v.softmax(dim=1) / q).argmax(dim=1, keepdim=True))[:, 0]


def timed(fn, sync, budget_s: float, min_reps: int = 3) -> float:
    """Median ms of ``fn`` over at least ``min_reps`` calls or ``budget_s`` seconds."""
    fn()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < budget_s:
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
        if len(times) >= 200:
            break
    return statistics.median(times)


def graph_kernels(params: list, logits: torch.Tensor) -> str:
    """The kernels of three replayed steps of ``ours`` (graph), by GPU time."""
    from torch.profiler import ProfilerActivity, profile

    bs = BatchSampler([CommonSampler(p) for p in params], logits.device)
    for _ in range(2):
        bs.sample(logits)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            bs.sample(logits)
        torch.cuda.synchronize()
    return "kernels of one replayed step, by GPU time:\n" + kernel_table(prof.events(), steps=3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="batch 64 x 49k only")
    args = ap.parse_args()
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    try:
        from flashinfer.sampling import top_k_top_p_sampling_from_logits  # type: ignore
    except ImportError:
        top_k_top_p_sampling_from_logits = None
    if device.type != "cuda":
        top_k_top_p_sampling_from_logits = None
    batches = (64,) if args.quick else (1, 8, 64, 256)
    vocabs = (49152,) if args.quick else (49152, 131072, 262144)
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}; ms per step (median)")
    cuda = device.type == "cuda"
    head = (f"{'vocab':>7} {'B':>4} {'ours':>9} {'sort':>9} {'cpu':>9} {'cpu/ours':>9} {'sort/ours':>9} {'same':>6}"
            f" {'ops':>5} {'syncs':>5}" + (f" {'kern':>5} {'eager':>9} {'same':>6}" if cuda else ""))
    if top_k_top_p_sampling_from_logits is not None:
        head += f" {'flashinfer':>10} {'ours/fi':>8}"
    print(head)
    rng = np.random.default_rng(0)
    notes: list[str] = []
    for v in vocabs:
        pool = np.stack([realistic_logits(v, rng) for _ in range(16)])
        for b in batches:
            host = pool[np.arange(b) % 16] + rng.normal(0, 0.05, (b, v)).astype(np.float32)
            logits = torch.from_numpy(host).to(device)
            params = [SamplingParams(seed=1000 + i) for i in range(b)]
            budget = 2.0 if b * v <= 64 * 131072 else 1.0
            bs = BatchSampler([CommonSampler(p) for p in params], device)
            ours = timed(lambda bs=bs, x=logits: bs.sample(x), sync, budget)
            gen = torch.Generator(device=device).manual_seed(0)
            sort = timed(lambda x=logits, g=gen: sort_baseline(x, g), sync, budget)
            cpu_chains = [CommonSampler(p) for p in params]
            cpu = timed(lambda h=host, cs=cpu_chains: [c.sample(h[i]) for i, c in enumerate(cs)], sync, budget)
            # exactness on fresh chains: the device tokens equal the CPU chains' tokens for 5 steps
            a = BatchSampler([CommonSampler(p) for p in params], device)
            ref = [CommonSampler(p) for p in params]
            same = all(a.sample(logits) == [c.sample(host[i]) for i, c in enumerate(ref)] for _ in range(5))
            counts = step_counts(BatchSampler([CommonSampler(p) for p in params], device), logits, steps=3)
            line = (f"{v:>7} {b:>4} {ours:>9.3f} {sort:>9.3f} {cpu:>9.3f} {cpu / ours:>9.2f} {sort / ours:>9.2f}"
                    f" {same!s:>6} {counts.ops:>5.0f} {counts.syncs:>5.0f}")
            if cuda:  # the step launched op by op (cuda_graph=False), beside the default replayed graph
                be = BatchSampler([CommonSampler(p) for p in params], device, cuda_graph=False)
                eager = timed(lambda bs=be, x=logits: bs.sample(x), sync, budget)
                e = BatchSampler([CommonSampler(p) for p in params], device, cuda_graph=False)
                ref = [CommonSampler(p) for p in params]
                e_same = all(e.sample(logits) == [c.sample(host[i]) for i, c in enumerate(ref)] for _ in range(5))
                line += f" {counts.kernels:>5.0f} {eager:>9.3f} {e_same!s:>6}"
                e_counts = step_counts(BatchSampler([CommonSampler(p) for p in params], device, cuda_graph=False),
                                       logits, steps=3)
                notes.append(f"{v} x {b}: synchronising calls per step, graph {dict(counts.sync_calls)}, eager "
                             f"{dict(e_counts.sync_calls)}")
                if b == 64 and v == 49152:
                    notes.append(graph_kernels(params, logits))
            if top_k_top_p_sampling_from_logits is not None:
                fi = timed(lambda x=logits, f=top_k_top_p_sampling_from_logits: f(x / TEMP, TOP_K, TOP_P), sync, budget)
                line += f" {fi:>10.3f} {ours / fi:>8.2f}"
            print(line, flush=True)
    print("\n".join(notes))


if __name__ == "__main__":
    main()
