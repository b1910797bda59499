"""Prompt processing and decode tokens/s: our runtime against its anchor on the same GGUF, in the same run.

CPU (default): against llama.cpp (llama-cpp-python), 2 threads each, the same prompt tokens and sampling parameters
(llama.cpp's default chain, seed 1234). Decode is timed over ``--n`` generated tokens (EOS ignored); prompt
processing over a ``--prompt-tokens`` batch. Also reported: the kernel the runtime chose (and every candidate's
measured decode step), load time, sampling's share of a decode step, and whether logits are batch-invariant.

Forward cost (CPU): the time of one forward of n = 1, 2, 4, 8, 16, 64 tokens in single-step units
(time(n) / time(1)), ours and llama.cpp's, in the same run, measured alike: the same token ids on both sides; both
after the same 64-token prefix already in the cache; only the last token's logits computed (llama.cpp's
``Llama.eval`` default, ``logits_all=False``; ours ``Context.decode``'s default output, the last row); a context of
the same size on both sides; one untimed forward of each n first, then the median of ``--forward-repeats`` timed
ones. Ours: ``ctx.seq_rm(0, 64, -1)`` (untimed), then ``ctx.decode(tokens[64:64 + n])`` timed. llama.cpp:
``llm.n_tokens = 64`` (``Llama.eval`` drops the cache cells past ``n_tokens`` itself, inside the timed call), then
``llm.eval(tokens[64:64 + n])`` timed. Each side runs as one block (ours, then llama.cpp), so that neither's
spinning worker threads share the two cores with the other's forwards. The table gives ms and steps on both sides
and the speed ratio (llama.cpp's ms / ours: above 1, ours is faster). A second table, "verify shape", times the
forward a speculative verification needs, every row's logits computed: ours ``outputs=[True] * n``, llama.cpp a
second ``Llama`` with ``logits_all=True`` (its ``eval`` then also copies every row into ``Llama.scores``, as ours
returns every row); its steps are in the same single-step unit (the last-row forward of 1 token).

Thread (CPU): ``model.generate`` of ``--n`` tokens (EOS ignored) from the main thread and from a second,
long-lived ``threading.Thread`` in the same process (as the server's engine thread), interleaved run by run
(main, thread, main, thread, ...) after one untimed run on each; decode ms per token (forward + sampling), the
median of ``--thread-repeats`` runs each, and the ratio thread / main (target: within 5 %).

``--device cuda``: single-stream decode (CUDA graphs and eager) and ``--batch`` sequences decoding together
(aggregate tok/s), against transformers on the same GGUF and GPU (greedy, fp32), and against llama.cpp's CUDA build
on the same GGUF: through llama-cpp-python (``LLAMA_CPP_LIB_PATH``: its CUDA libraries), every layer offloaded,
driven exactly as ours: the same 8-token prompt, llama.cpp's default chain (top-k 40, top-p 0.95, min-p 0.05,
temperature 0.8, sampled on the host on both sides), EOS ignored, tok/s by the wall clock from the first generated
token to the last of a Python loop (``model.generate`` / ``Llama.generate``), median of 3; and ``llama-bench``'s
decode rate (``LLAMA_BENCH``: its binary; no sampling, no Python: llama.cpp's ceiling). Ours also reports the split
of a step (forward, sampling), the CUDA kernels one replayed step launches and their GPU time.
Run: ``make bench`` (installs llama-cpp-python), or ``python -m benchmarks.bench_generate --gemma``;
``--forward-only`` or ``--thread-only`` for just one table.
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import threading
import time

import numpy as np
import torch

from samplechain import SamplingParams
from samplechain.device.profile import kernel_table
from samplechain.runtime import Context, load_model, model_path
from samplechain.runtime import kernels as K
from samplechain.runtime.cpu_engine import CEngine, supported_isas

TEXT = ("The history of the ocean is the history of the planet: its currents carry heat from the equator to the "
        "poles, its depths store carbon for centuries, and its surface sets the weather of every continent. ")
FORWARD_NS = (1, 2, 4, 8, 16, 64)
PREFIX = 64  # tokens already in the cache before every timed forward
FORWARD_CTX = 256  # cells of the context on both sides (PREFIX + the largest n fit)
TARGET_STEPS = {8: 2.0, 64: 8.0}  # target: forward of n tokens <= this many single-token steps
TARGET_THREAD = 0.05  # target: decode from a second thread within 5 % of the main thread


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


# --- forward cost -------------------------------------------------------------------------------------------------

def _median_forward(run, repeats):
    """{n: median seconds of ``run(n)``} for each n of FORWARD_NS, after one untimed ``run(n)``; ``run`` returns the
    seconds it timed."""
    res = {}
    for n in FORWARD_NS:
        run(n)
        res[n] = statistics.median(run(n) for _ in range(repeats))
    return res


def forward_cost_ours(model, tokens, repeats, transformer=None):
    """Ours: ({n: median s} with the last row's logits, {n: median s} with every row's) of one forward of n tokens
    after the PREFIX already in the cache (``transformer``: the model on another kernel)."""
    ctx = Context(transformer or model.transformer, FORWARD_CTX)
    ctx.decode(tokens[:PREFIX])

    def run(n, every_row=False):
        ctx.seq_rm(0, PREFIX, -1)
        batch = tokens[PREFIX:PREFIX + n]
        outputs = [True] * n if every_row else None
        t0 = time.perf_counter()
        ctx.decode(batch, outputs=outputs)
        return time.perf_counter() - t0

    return _median_forward(run, repeats), _median_forward(lambda n: run(n, True), repeats)


def forward_cost_llama(path, tokens, repeats):
    """llama.cpp: the same two dicts, ``Llama.eval`` of n tokens after the PREFIX (the every-row case on a second
    ``Llama``, ``logits_all=True``)."""
    import llama_cpp

    from benchmarks import _llama

    _llama.without_extra_bufts()
    res = []
    for logits_all in (False, True):
        llm = llama_cpp.Llama(path, n_threads=2, n_threads_batch=2, n_ctx=FORWARD_CTX, n_batch=512,
                              logits_all=logits_all, verbose=False)
        llm.eval(tokens[:PREFIX])

        def run(n, llm=llm):
            llm.n_tokens = PREFIX  # eval drops the cache cells past n_tokens itself
            batch = tokens[PREFIX:PREFIX + n]
            t0 = time.perf_counter()
            llm.eval(batch)
            return time.perf_counter() - t0

        res.append(_median_forward(run, repeats))
        del llm
    return res[0], res[1]


def forward_table(name, model, tokens, repeats, with_llama=True):
    """The forward-cost table of one model: ours as one block, then llama.cpp as one block."""
    time.sleep(0.5)  # the previous section's worker threads go idle
    last, every = forward_cost_ours(model, tokens, repeats)
    q8 = None
    if "avx2-q8" in supported_isas(q8=True) and model.transformer.kernel.startswith("c-"):
        t = model.transformer
        q8 = forward_cost_ours(model, tokens, repeats, t.with_engine(CEngine(t, "avx2-q8"), "c-avx2-q8"))
    l_last = l_every = None
    if with_llama:
        time.sleep(0.5)
        l_last, l_every = forward_cost_llama(model_path(name), tokens, repeats)
    unit = last[1]
    print(f"\nforward cost, {name} (kernel {model.transformer.kernel}, 2 threads each): one forward of n tokens after "
          f"a {PREFIX}-token prefix in the cache, the same token ids, median of {repeats}; steps = time(n) / "
          f"time(1 token, last row); speed = llama.cpp ms / ours ms (> 1: ours faster)")
    print(f"{'':<12} {'n':>3}  {'ours ms':>8} {'steps':>6} | {'8-bit ms':>8} {'steps':>6} | {'llama.cpp ms':>12} "
          f"{'steps':>6} | {'speed':>6}")
    for i, (title, ours_t, llama_t) in enumerate((("last row", last, l_last), ("verify shape", every, l_every))):
        for n in FORWARD_NS:
            o = ours_t[n]
            left = f"{title if n == 1 else '':<12} {n:3d}  {1e3 * o:8.2f} {o / unit:6.2f} |"
            if q8 is None:
                left += f" {'-':>8} {'-':>6} |"
            else:
                left += f" {1e3 * q8[i][n]:8.2f} {q8[i][n] / q8[0][1]:6.2f} |"
            if llama_t is None:
                print(f"{left} {'-':>12} {'-':>6} | {'-':>6}")
            else:
                ll = llama_t[n]
                print(f"{left} {1e3 * ll:12.2f} {ll / l_last[1]:6.2f} | {ll / o:6.2f}")
    print("  last row: only the last token's logits (Llama.eval's default, Context.decode's default); verify shape: "
          "every row's logits (ours outputs=[True] * n, llama.cpp Llama(logits_all=True)), steps in the last-row "
          "single-step unit; 8-bit: the opt-in c-avx2-q8 kernel (llama.cpp's activation numerics), its own unit; "
          "speed: against ours on the chosen kernel")
    for n, limit in TARGET_STEPS.items():
        steps = last[n] / unit
        print(f"  target: forward of {n} tokens <= {limit:.1f} steps (ours, last row): {steps:.2f}, "
              f"{'met' if steps <= limit else 'NOT met'}")


# --- decode from a second thread ----------------------------------------------------------------------------------

def thread_decode(model, tokens, n_decode, repeats):
    """Decode ms per token (forward + sampling) of ``model.generate`` from the main thread and from one long-lived
    second thread, interleaved: (main runs, thread runs, torch threads seen by main, by the thread)."""
    params = SamplingParams(seed=1234, ignore_eos=True)

    def run():
        for _ in model.generate(tokens[:8], params, n_predict=n_decode):
            pass
        t = model.timings
        return t.eval_ms / t.n_eval + t.sample_ms / t.n_sample, torch.get_num_threads()

    jobs, results = queue.Queue(), queue.Queue()

    def worker():
        while jobs.get():
            try:
                results.put(run())
            except BaseException as e:  # re-raised in the main thread
                results.put(e)

    def in_thread():
        jobs.put(True)
        out = results.get()
        if isinstance(out, BaseException):
            raise out
        return out

    th = threading.Thread(target=worker, name="bench-decode", daemon=True)
    th.start()
    try:
        main_threads = run()[1]  # one untimed run on each
        thread_threads = in_thread()[1]
        main, other = [], []
        for _ in range(repeats):
            main.append(run()[0])
            other.append(in_thread()[0])
    finally:
        jobs.put(False)
        th.join(60)
    return main, other, main_threads, thread_threads


def thread_table(name, model, tokens, n_decode, repeats):
    main, other, t_main, t_thread = thread_decode(model, tokens, n_decode, repeats)
    m, o = statistics.median(main), statistics.median(other)
    ratio = o / m
    print(f"\ndecode from a second thread, {name}: {n_decode} tokens per run, main thread and a second thread "
          f"interleaved, median of {repeats} runs each (ms per token, forward + sampling)")
    for who, x, runs, nt in (("main thread", m, main, t_main), ("second thread", o, other, t_thread)):
        print(f"  {who:<14} {x:7.2f} ms/token ({1e3 / x:6.1f} tok/s; torch threads {nt}; runs "
              f"{', '.join(f'{r:.2f}' for r in runs)})")
    print(f"  thread / main  {ratio:7.3f}; target: within {100 * TARGET_THREAD:.0f} %, "
          f"{'met' if abs(ratio - 1) <= TARGET_THREAD else 'NOT met'}")


def cpu(args):
    names = ["smollm2"] + (["gemma3-270m"] if args.gemma else [])
    if args.forward_only or args.thread_only:
        for name in names:
            model = load_model(name, n_threads=2)
            tokens = model.tokenize(TEXT * 40)
            if args.forward_only:
                forward_table(name, model, tokens, args.forward_repeats, not args.no_llama)
            if args.thread_only:
                thread_table(name, model, tokens, args.n, args.thread_repeats)
        return
    models = {}
    print(f"{'model':>12}  {'what':<22} {'ours':>9} {'llama.cpp':>10} {'ratio':>6}")
    for name in names:
        model, load_s, pp, tg, share, tokens = ours(name, args.prompt_tokens, args.n, args.repeats)
        models[name] = model
        l_load, l_pp, l_tg = llama_cpp(model_path(name), tokens, args.n, args.repeats)
        print(f"{name:>12}  {'load s':<22} {load_s:9.2f} {l_load:10.2f} {load_s / l_load:6.2f}")
        print(f"{name:>12}  {'prompt tok/s':<22} {pp:9.1f} {l_pp:10.1f} {pp / l_pp:6.2f}")
        print(f"{name:>12}  {'decode tok/s':<22} {tg:9.1f} {l_tg:10.1f} {tg / l_tg:6.2f}")
        print(f"{name:>12}  {'sampling share':<22} {100 * share:8.1f}%")
        print(f"{name:>12}  {'kernel':<22} {model.transformer.kernel:>9}")
        print(f"{name:>12}  {'batch-invariant':<22} {'yes' if invariant(model, tokens) else 'NO':>9}")
        if args.candidates:
            trials = K.measure(model.transformer, opt_in=True)  # with the 8-bit kernel's accuracy
            print(K.report(trials, K.pick(trials).name))
    for name, model in models.items():
        tokens = model.tokenize(TEXT * 40)
        forward_table(name, model, tokens, args.forward_repeats)
        thread_table(name, model, tokens, args.n, args.thread_repeats)


# --- CUDA ---------------------------------------------------------------------------------------------------------

def _sync():
    torch.cuda.synchronize()


def cuda_single(model, tokens, n_decode, **sampling):
    """Single-stream generation with the default chain (sampled on the CPU): tok/s by the wall clock from the first
    generated token to the last (as ``llama_decode_rate``), the median of 3 runs, and the timings' split of a step
    into the forward (with the logits' copy to the host) and sampling, in ms."""
    params = SamplingParams(seed=1234, ignore_eos=True, **sampling)
    for _ in model.generate(tokens[:8], params, n_predict=8):
        pass  # graphs captured, cuBLAS warm
    rates, splits = [], []
    for _ in range(3):
        n, t0 = 0, None
        for _ in model.generate(tokens[:8], params, n_predict=n_decode + 1):
            if t0 is None:  # the first token comes out of prompt processing
                t0 = time.perf_counter()
            n += 1
        rates.append((n - 1) / (time.perf_counter() - t0))
        t = model.timings
        splits.append((t.eval_ms / t.n_eval, t.sample_ms / t.n_sample))
    return statistics.median(rates), min(splits)


def cuda_step_profile(model, tokens):
    """One replayed single-token decode step under torch.profiler: CUDA kernels launched and their summed time
    (ms), and the wall time of the step with its logits on the host (ms, median of 20)."""
    ctx = model.new_context(512)
    ctx.decode(tokens[:8])
    walls = []
    for i in range(22):
        _sync()
        t0 = time.perf_counter()
        ctx.decode(tokens[8 + i:9 + i], positions=[8 + i]).cpu()
        walls.append(time.perf_counter() - t0)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        ctx.decode(tokens[30:31], positions=[30]).cpu()
        _sync()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_ms = sum(e.device_time for e in kernels) / 1e3
    return len(kernels), gpu_ms, 1e3 * statistics.median(walls[2:]), kernel_table(kernels)


def llama_cuda(path, tokens, n_decode):
    """llama.cpp's CUDA build through llama-cpp-python (``LLAMA_CPP_LIB_PATH`` names its libraries): every layer on
    the GPU, the same 8-token prompt, default chain and decode loop as ours (``llama_decode_rate``, median of 3),
    with flash attention off (llama-cpp-python's default) and on (llama.cpp's ``auto`` on this GPU): the faster, and
    both rates. None when llama-cpp-python is missing or its library has no GPU offload."""
    try:
        import llama_cpp
    except ImportError:
        return None
    if not llama_cpp.llama_supports_gpu_offload():
        return None
    rates = {}
    for fa in (False, True):
        llm = llama_cpp.Llama(path, n_gpu_layers=-1, n_ctx=1024, n_batch=512, flash_attn=fa, verbose=False)
        llama_decode_rate(llm, tokens, 8)  # warm: CUDA graphs, cuBLAS
        rates[fa] = statistics.median(llama_decode_rate(llm, tokens, n_decode) for _ in range(3))
        del llm
    print(f"llama.cpp CUDA (llama-cpp-python): flash attention off {rates[False]:.1f} tok/s, on {rates[True]:.1f}")
    return max(rates.values())


def llama_bench_cuda(path, n_decode):
    """``llama-bench -ngl 99 -p 0 -n N -fa 0,1`` (``LLAMA_BENCH`` names the binary): llama.cpp's decode tok/s with
    no sampling and no Python, the C++ ceiling (the faster of flash attention off and on); None without the binary."""
    import json
    import subprocess

    exe = os.environ.get("LLAMA_BENCH")
    if not exe or not os.path.exists(exe):
        return None
    out = subprocess.run([exe, "-m", path, "-ngl", "99", "-p", "0", "-n", str(n_decode), "-r", "3", "-fa", "0,1",
                          "-o", "json"], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        print(out.stderr[-2000:])
        return None
    return max(float(row["avg_ts"]) for row in json.loads(out.stdout))


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


def transformers_anchor(path, tokens, batch, n_decode):
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        return None, None

    folder, file = os.path.split(path)
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


def attempt(fn, *args):
    """``fn(*args)``, or None with the traceback printed: one anchor's failure leaves the rest of the table."""
    import traceback

    try:
        return fn(*args)
    except Exception:
        traceback.print_exc()
        return None


def cuda(args):
    kernels = ["cuda-graph-tf32", "cuda-graph", "cuda-eager"]
    path = model_path(args.model)
    models = {k: load_model(path, device="cuda", kernel=k) for k in kernels}
    tokens = models[kernels[0]].tokenize(TEXT * 4)
    hf1, hfb = transformers_anchor(path, tokens, args.batch, args.n)
    single = {k: cuda_single(m, tokens, args.n) for k, m in models.items()}
    batched = {k: cuda_batch(m, tokens, args.batch, args.n) for k, m in models.items()}
    lc, lb = attempt(llama_cuda, path, tokens, args.n), attempt(llama_bench_cuda, path, args.n)
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, {os.path.basename(path)} "
          "(ours: fp32 weights)")
    print(f"{'what':<22} " + " ".join(f"{k:>15}" for k in kernels) + f" {'transformers':>12} {'ratio':>6}")
    for what, row, hf in (("single stream tok/s", {k: v[0] for k, v in single.items()}, hf1),
                          (f"{args.batch} sequences tok/s", batched, hfb)):
        best = max(row.values())
        ratio = f"{best / hf:6.1f}" if hf else f"{'-':>6}"
        hf_s = f"{hf:12.1f}" if hf else f"{'n/a':>12}"
        print(f"{what:<22} " + " ".join(f"{row[k]:15.1f}" for k in kernels) + f" {hf_s} {ratio}")
    print(f"{'step ms: forward':<22} " + " ".join(f"{single[k][1][0]:15.3f}" for k in kernels))
    print(f"{'step ms: sampling':<22} " + " ".join(f"{single[k][1][1]:15.3f}" for k in kernels))
    fastest = max(single, key=lambda k: single[k][0])
    profiles = {k: cuda_step_profile(m, tokens) for k, m in models.items()}
    print(f"{'kernels per step':<22} " + " ".join(f"{profiles[k][0]:15d}" for k in kernels))
    print(f"{'GPU ms per step':<22} " + " ".join(f"{profiles[k][1]:15.3f}" for k in kernels))
    print(f"{'step wall ms':<22} " + " ".join(f"{profiles[k][2]:15.3f}" for k in kernels))
    print(f"kernels of one {fastest} step, by GPU time:\n{profiles[fastest][3]}")
    best = single[fastest][0]
    on_gpu = attempt(lambda: cuda_single(models[fastest], tokens, args.n, backend_sampling=True, backend_dist=True))
    if on_gpu is not None:
        print(f"ours ({fastest}), the chain sampled on the GPU (--backend-sampling --backend-dist): "
              f"{on_gpu[0]:.1f} tok/s" + (f"; / llama.cpp's same loop = {on_gpu[0] / lc:.2f}" if lc else ""))
    for name, rate in (("llama.cpp CUDA, same loop (llama-cpp-python generate)", lc), ("llama-bench tg", lb)):
        if rate is None:
            print(f"{name}: not available")
        else:
            print(f"{name}: {rate:.1f} tok/s; ours (best kernel) / it = {best / rate:.2f}")
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
    parser.add_argument("--model", default="smollm2", help="GGUF path or packaged model name (cuda)")
    parser.add_argument("--forward-repeats", type=int, default=15, help="timed forwards per n and side (median)")
    parser.add_argument("--thread-repeats", type=int, default=5, help="runs per thread, main and second (median)")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--forward-only", action="store_true", help="only the forward-cost table (cpu)")
    only.add_argument("--thread-only", action="store_true", help="only the second-thread decode table (cpu)")
    parser.add_argument("--no-llama", action="store_true", help="--forward-only without llama.cpp's column")
    args = parser.parse_args()
    if min(args.forward_repeats, args.thread_repeats, args.repeats) < 1:
        parser.error("repeats must be at least 1")
    if args.device == "cuda":
        cuda(args)
    else:
        torch.set_num_threads(2)
        load_before = os.getloadavg()[0]
        cpu(args)
        print(f"\n1-minute load average of this machine ({os.cpu_count()} CPUs): {load_before:.2f} before the run, "
              f"{os.getloadavg()[0]:.2f} after (it includes this benchmark's own load; another process on the cores "
              f"makes every timing here meaningless)")


if __name__ == "__main__":
    main()
