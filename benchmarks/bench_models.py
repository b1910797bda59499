"""The models people run, at their real shapes: decode and prompt tok/s and peak memory against llama.cpp.

Two random-weight models with the exact shapes of Llama-3.2-1B (llama, 16 layers, 2048 wide, GQA 32/8, 128256-token
Llama 3 vocabulary, rope_freqs, tied output) and Qwen2.5-0.5B (qwen2, 24 layers, 896 wide, GQA 14/2, q/k/v biases,
151936 tokens, tied output) are written by ``tests/model_fixtures`` (seeded) as F16 and quantized by llama.cpp's own
quantizer to Q4_K_M (Q4_K with Q6_K where llama.cpp's recipe puts it; Qwen's 896-wide rows fall back to llama.cpp's
choices). Random weights cost the same time as trained ones. The files are built once into the cache directory.

Fairness: each side runs in its own fresh process (so peak RSS is its own), 2 threads, the same prompt tokens
(``--prompt-tokens``: 256 and 512 random ids, one batch each) and the same decode rule (``--n`` tokens, EOS ignored,
llama.cpp's default sampler chain through each side's own sampler, seed 1234). Both processes load (one after the
other), then run in turns: ``--repeats`` rounds of one prompt run each, then of one decode run each, the side that
goes first alternating, after an untimed run each; so a shared host that drifts during the run moves both sides
alike. Rates are each side's median; the prompt and decode ratios are the medians of the rounds' ratios.
Peak RSS is measured after loading and after the run (``VmHWM``), next to the file size and the KV cache each side
allocates; the process's RSS before loading (Python, and for us torch) is reported and taken off for the model's own
share. Load times are warm on both sides: llama.cpp maps its file (in the page cache after the first run), we map our
packed weights, cached by a first load in a process of its own whose time is shown as "first load" (it packs only when
the model has no cache yet). The KV caches are both 16-bit (f16, both defaults). Last, one token through each kind of
matrix of ours as GB/s of the weights it reads, cached and from memory, beside the machine's own memory bandwidth
(numpy's stream copy, torch's 2-thread read).
Run: ``python -m benchmarks.bench_models`` (needs the bench extra: llama-cpp-python).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SHAPES = {
    # name: (family in tests/model_fixtures, Shape fields, context length)
    "llama-3.2-1b": ("llama3", dict(n_vocab=128256, n_embd=2048, n_head=32, n_head_kv=8, head_dim=64, n_ff=8192,
                                    n_layer=16), 131072),
    "qwen2.5-0.5b": ("qwen2", dict(n_vocab=151936, n_embd=896, n_head=14, n_head_kv=2, head_dim=64, n_ff=4864,
                                   n_layer=24), 32768),
}
N_CTX = 1024
PAUSE_S = 0.3  # between two timed runs: llama.cpp's OpenMP threads spin for a while after a computation


def build(name: str) -> Path:
    """The model's Q4_K_M file (built once: F16 from the seeded generator, quantized by llama.cpp)."""
    from tests import model_fixtures as mf

    from samplechain.runtime.cpu_engine import cache_dir

    folder = Path(cache_dir()) / "bench-models"
    out = folder / f"{name}-Q4_K_M.gguf"
    if out.exists():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    family_name, fields, n_ctx_train = SHAPES[name]
    base = next(f for f in mf.FAMILIES if f.name == family_name)
    family = mf.Family(name, base.arch, base.vocab, tied=True, extra=base.extra)
    shape = mf.Shape(**fields)
    print(f"building {out.name} (random weights, llama.cpp's quantizer) ...", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        f16 = Path(tmp) / f"{name}-F16.gguf"
        tensors = mf._weights(family, shape, n_vocab=shape.n_vocab, dtype=np.float16)
        tensors = {k: v if v.ndim == 1 else v.astype(np.float16, copy=False) for k, v in tensors.items()}
        mf.write_gguf(family, f16, tensors, shape, context_length=n_ctx_train)
        del tensors
        partial = Path(tmp) / out.name
        mf._quantize(f16, partial, mf.QUANT_TYPES["Q4_K_M"])
        os.replace(partial, out)
    return out


def _rss_mib() -> float:
    """The process's peak resident memory so far: Linux's VmHWM, the high-water mark of this program's own memory
    (``ru_maxrss`` also keeps the parent's, which the child had until its exec: the driver's ~220 MiB was a floor
    under both sides' figures)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _prompt_rate(clear, run, tokens: list[int]) -> float:
    """tok/s of one prompt run on an emptied cache: ``clear()``, then ``run(tokens)`` timed."""
    clear()
    t0 = time.perf_counter()
    run(tokens)
    return len(tokens) / (time.perf_counter() - t0)


class Ours:
    """Our side in its worker process: the model loaded, a context for the prompt rounds, ``generate`` for decode."""

    def __init__(self, path: str, tokens: list[int], n: int) -> None:
        import torch  # noqa: F401  (part of the process before the model: its RSS is in rss_base_mib)

        from samplechain import SamplingParams
        from samplechain.runtime import load_model

        self.rss_base = _rss_mib()  # the interpreter with torch imported, before the model
        start = time.perf_counter()
        self.model = load_model(path, n_threads=2)
        self.load_s = time.perf_counter() - start
        self.rss_load = _rss_mib()
        self.tokens, self.n = tokens, n
        self.params = SamplingParams(seed=1234, ignore_eos=True)
        self.ctx = self.model.new_context(N_CTX)
        kv = self.ctx.kv
        self.kv_mib = (kv.k.numel() * kv.k.element_size() + kv.v.numel() * kv.v.element_size()) / 2**20
        self.kernel = self.model.transformer.kernel

    def prompt(self) -> float:
        return _prompt_rate(self.ctx.clear, self.ctx.decode, self.tokens)

    def decode(self) -> float:
        self.ctx = None  # generate makes a context of its own: one KV cache at a time, as llama.cpp's one
        for _ in self.model.generate(self.tokens[:8], self.params, n_predict=self.n, n_ctx=N_CTX):
            pass
        t = self.model.timings
        return 1e3 * t.n_eval / t.eval_ms


def run_load(path: str) -> dict:
    """Our load alone, in a fresh process: the warm load once the packed weights are cached."""
    import torch  # noqa: F401  (imported before the clock starts, as in Ours)

    from samplechain.runtime import load_model

    start = time.perf_counter()
    model = load_model(path, n_threads=2)
    return {"load_s": time.perf_counter() - start, "kernel": model.transformer.kernel}


def run_bandwidth(path: str, repeats: int) -> dict:
    """GB/s of one token through each kind of matrix (the packed bytes read per product), in one process, 2 threads:
    "cached", the product repeated (a matrix that fits the last-level cache is read from it), and "from memory", each
    product after numpy has read 1 GiB to evict the caches (a decode step streams every weight once, as the largest
    matrix, the output, always is; numpy's one thread, as torch's pool would spin on a CPU after its sum and slow the
    product by a third); beside the machine's memory bandwidth: numpy's stream copy of 512 MiB (read + write, one
    thread) and, last, torch's sum of 1 GiB (read, 2 threads)."""
    import ctypes

    import torch

    from samplechain.runtime import load_model
    from samplechain.runtime.cpu_engine import ALL_ISAS, library, packed_bytes

    model = load_model(path, n_threads=2)
    t = model.transformer
    isa = t.kernel.removeprefix("c-")
    lib = library()
    out = {}
    flush = np.ones(1 << 28, dtype=np.float32)  # 1 GiB
    linears = {"output": t.output, **{role: getattr(t.layers[len(t.layers) // 2], role)
                                      for role in ("qkv", "wo", "gate_up", "down")}}
    for role, lin in linears.items():
        packed, own = lin.engine_form
        x = np.random.default_rng(0).standard_normal((1, lin.shape[1])).astype(np.float32)
        y = np.empty((1, lin.shape[0]), dtype=np.float32)
        for where in ("cached", "from memory"):
            times = []
            for _ in range(5 * repeats):
                if where == "from memory":
                    flush.sum()
                t0 = time.perf_counter()
                lib.sc_linear_forward(ctypes.byref(packed), 1, ctypes.c_void_p(x.ctypes.data),
                                      ctypes.c_void_p(y.ctypes.data), ALL_ISAS[isa], 2)
                times.append(time.perf_counter() - t0)
            rate = packed_bytes(own) / statistics.median(times) / 1e9
            out[f"{role} {lin.shape[0]}x{lin.shape[1]} {lin.form} ({where})"] = rate
    a = np.ones(1 << 27, dtype=np.float32)
    b = np.empty_like(a)
    times = []
    for _ in range(3 * repeats):
        t0 = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - t0)
    out["stream copy (numpy, 1 thread: read + write)"] = 2 * a.nbytes / min(times) / 1e9
    torch.set_num_threads(2)
    read = torch.from_numpy(flush)
    times = []
    for _ in range(3 * repeats):
        t0 = time.perf_counter()
        read.sum()
        times.append(time.perf_counter() - t0)
    out["memory read (torch sum, 2 threads)"] = flush.nbytes / min(times) / 1e9
    return out


class Llama:
    """llama.cpp's side in its worker process (llama-cpp-python), driven as ours is."""

    def __init__(self, path: str, tokens: list[int], n: int) -> None:
        import llama_cpp

        from benchmarks import _llama
        from benchmarks.bench_generate import llama_decode_rate  # its imports in rss_base, as ours's torch

        self.decode_rate = llama_decode_rate

        _llama.without_extra_bufts()
        self.rss_base = _rss_mib()
        start = time.perf_counter()
        self.llm = llama_cpp.Llama(path, n_threads=2, n_threads_batch=2, n_ctx=N_CTX, n_batch=512, verbose=False)
        self.load_s = time.perf_counter() - start
        self.rss_load = _rss_mib()
        self.tokens, self.n = tokens, n
        meta = self.llm.metadata
        arch = meta["general.architecture"]
        n_layer, n_kv = int(meta[f"{arch}.block_count"]), int(meta[f"{arch}.attention.head_count_kv"])
        head = int(meta.get(f"{arch}.attention.key_length", int(meta[f"{arch}.embedding_length"])
                            // int(meta[f"{arch}.attention.head_count"])))
        self.kv_mib = 2 * n_layer * n_kv * head * N_CTX * 2 / 2**20  # f16 cache
        self.kernel = "llama.cpp"

    def prompt(self) -> float:
        return _prompt_rate(self.llm.reset, self.llm.eval, self.tokens)

    def decode(self) -> float:
        return self.decode_rate(self.llm, self.tokens, self.n)


def serve(side: str, path: str, tokens: list[int], n: int) -> None:
    """A worker process's loop: load, say so with the load time and RSS, then time one prompt or one decode run per
    line the driver writes ("prompt", "decode"), and at "done" report the peak RSS."""
    s = (Ours if side == "ours" else Llama)(path, tokens, n)
    print(json.dumps({"load_s": s.load_s, "rss_base_mib": s.rss_base, "rss_load_mib": s.rss_load,
                      "kv_mib": s.kv_mib, "kernel": s.kernel}), flush=True)
    for line in sys.stdin:
        what = line.strip()
        if what not in ("prompt", "decode"):
            break
        print(json.dumps(getattr(s, what)()), flush=True)
    print(json.dumps({"rss_peak_mib": _rss_mib()}), flush=True)


class Worker:
    """One side in a fresh process of its own (its own peak RSS), timed on request."""

    def __init__(self, side: str, *args: object) -> None:
        code = f"from benchmarks.bench_models import serve; serve({side!r}, *{args!r})"
        self.side, self.err = side, tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err, text=True)
        self.info = self._read()

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self.err.seek(0)
            raise RuntimeError(f"{self.side} failed: {self.err.read()[-3000:]}")
        return json.loads(line)

    def _ask(self, what: str):
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return self._read()

    def time(self, what: str) -> float:
        """tok/s of one run: ``what`` is "prompt" or "decode"."""
        return self._ask(what)

    def close(self) -> dict:
        self.info.update(self._ask("done"))
        self.proc.wait()
        return self.info


def rounds(workers: list[Worker], what: str, repeats: int) -> list[list[float]]:
    """``repeats`` rounds in which each side runs once, in turn (the first side alternates), so that a host that
    speeds up or slows down during the run moves both sides alike, after one untimed run each (the first touches the
    mapped weights); a pause before each run lets the other side's threads stop spinning. [side][round] -> rate."""
    for w in workers:
        time.sleep(PAUSE_S)
        w.time(what)
    rates: list[list[float]] = [[] for _ in workers]
    for r in range(repeats):
        order = range(len(workers)) if r % 2 == 0 else reversed(range(len(workers)))
        for i in order:
            time.sleep(PAUSE_S)
            rates[i].append(workers[i].time(what))
    return rates


def worker(side: str, *args: object) -> dict:
    """A one-shot job (``run_load``, ``run_bandwidth``) in a fresh process."""
    code = (f"import json, sys; from benchmarks.bench_models import run_{side}; "
            f"print(json.dumps(run_{side}{tuple(args)!r}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{side} failed: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(SHAPES))
    ap.add_argument("--prompt-tokens", default="256,512", help="prompt lengths, comma-separated")
    ap.add_argument("--n", type=int, default=64, help="decoded tokens")
    ap.add_argument("--repeats", type=int, default=5, help="rounds of each side's prompt and decode runs")
    ap.add_argument("--no-llama", action="store_true", help="ours only (no anchor)")
    ap.add_argument("--no-bandwidth", action="store_true", help="skip the GB/s per matrix kind")
    args = ap.parse_args()
    lengths = [int(v) for v in args.prompt_tokens.split(",")]
    print(f"{'model':>14}  {'what':<20} {'ours':>9} {'llama.cpp':>10} {'ratio':>6}")
    for name in args.models.split(","):
        path = str(build(name))
        file_mib = os.path.getsize(path) / 2**20
        vocab = SHAPES[name][1]["n_vocab"]
        rng = np.random.default_rng(1234)
        first = worker("load", path)  # packs and caches on a first run (else already warm)
        for length in lengths:
            tokens = rng.integers(0, min(vocab, 100000), length).tolist()
            sides = [Worker("ours", path, tokens, args.n)]  # loaded one after the other, then timed in turns
            if not args.no_llama:
                sides.append(Worker("llama", path, tokens, args.n))
            rates = {what: rounds(sides, what, args.repeats) for what in ("prompt", "decode")}
            infos = [w.close() for w in sides]
            for i, info in enumerate(infos):
                info.update({what: statistics.median(r[i]) for what, r in rates.items()})
            by_round = None if args.no_llama else {
                what: [a / b for a, b in zip(*r, strict=True)] for what, r in rates.items()}
            ratios = by_round and {what: statistics.median(v) for what, v in by_round.items()}
            _report(name, length, infos[0], infos[1] if len(infos) > 1 else None, file_mib, first, ratios, by_round)
        if not args.no_bandwidth:
            for what, rate in worker("bandwidth", path, min(args.repeats, 3)).items():
                print(f"{name:>14}  {'GB/s ' + what}: {rate:.1f}")


def _report(name: str, length: int, us: dict, them: dict | None, file_mib: float, first: dict,
            ratios: dict | None = None, by_round: dict | None = None) -> None:
    """The table's rows; ``ratios``: prompt and decode as the median of the rounds' ratios (``by_round``, each round
    runs both sides, printed too), the other rows as ours / llama.cpp."""
    print(f"{name:>14}  {'prompt tokens':<20} {length:9d}")
    for side in (us, them) if them else (us,):
        side["model_mib"] = side["rss_peak_mib"] - side["rss_base_mib"]
    print(f"{name:>14}  {'first load s':<20} {first['load_s']:9.2f}")
    for what, key in (("decode tok/s", "decode"), ("prompt tok/s", "prompt"), ("load s", "load_s"),
                      ("RSS before load MiB", "rss_base_mib"), ("RSS after load MiB", "rss_load_mib"),
                      ("peak RSS MiB", "rss_peak_mib"), ("peak - before MiB", "model_mib")):
        a, b = us[key], them[key] if them else None
        ratio = f"{(ratios or {}).get(key, a / b if b else 0):6.2f}" if b else f"{'-':>6}"
        anchor = f"{b:10.2f}" if b is not None else f"{'-':>10}"
        print(f"{name:>14}  {what:<20} {a:9.2f} {anchor} {ratio}")
    for what, v in (by_round or {}).items():
        print(f"{name:>14}  {what + ' ratio by round':<20} {' '.join(f'{x:.2f}' for x in v)}")
    print(f"{name:>14}  {'file MiB':<20} {file_mib:9.1f}")
    print(f"{name:>14}  {'KV cache MiB':<20} {us['kv_mib']:9.1f} {them['kv_mib'] if them else 0:10.1f}")
    limit = 1.15 * file_mib + us["kv_mib"]
    loaded = us["rss_load_mib"] - us["rss_base_mib"]
    print(f"{name:>14}  {'loaded / (1.15 file + KV)':<20} {loaded / limit:9.2f}")
    print(f"{name:>14}  {'peak / (1.15 file + KV)':<20} {us['model_mib'] / limit:9.2f}")
    print(f"{name:>14}  {'kernel':<20} {us['kernel']:>9}")


if __name__ == "__main__":
    main()
