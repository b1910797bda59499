"""samplechain's logits processor inside vLLM (CPU build, in-process engine, a tiny random Llama with SmolLM2's
49,152-token vocabulary): the processor's step alone, and vLLM's decode step and throughput with llama.cpp's default
chain per request against vLLM's own sampling of the same chain's settings (top-k 40, top-p 0.95, min-p 0.05,
temperature 0.8), at 1, 8 and 32 concurrent requests. Run with ``make bench-vllm``."""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests_vllm.tiny_model import build, gguf_path

os.environ.setdefault("SAMPLECHAIN_VLLM_VOCAB", str(gguf_path()))
N_VOCAB = 49152
SIZES = (1, 8, 32)
MAX_TOKENS = 64


def processor_step_ms(batch: int, repeats: int = 30) -> float:
    """``apply`` alone on a [batch, 49152] row block, every row on llama.cpp's default chain (median ms)."""
    from types import SimpleNamespace

    import torch
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate

    from samplechain.integrations.vllm import SamplechainLogitsProcessor

    config = SimpleNamespace(speculative_config=None, model_config=SimpleNamespace(get_vocab_size=lambda: N_VOCAB))
    proc = SamplechainLogitsProcessor(config, torch.device("cpu"), False)
    outs = [[] for _ in range(batch)]
    proc.update_state(BatchUpdate(batch, [], [(i, SamplingParams(extra_args={"seed": i}), [1, 2, 3], outs[i])
                                              for i in range(batch)], []))
    gen = torch.Generator().manual_seed(0)
    times = []
    for _ in range(repeats):
        x = torch.randn(batch, N_VOCAB, generator=gen) * 3
        t0 = time.perf_counter()
        out = proc.apply(x)
        times.append((time.perf_counter() - t0) * 1000)
        for i, tok in enumerate(out.argmax(1).tolist()):
            outs[i].append(tok)
    return statistics.median(times[3:])


def engine(model_dir: Path):
    from vllm import LLM

    from samplechain.integrations.vllm import SamplechainLogitsProcessor

    return LLM(str(model_dir), distributed_executor_backend="uni", enforce_eager=True, max_model_len=256, seed=0,
               max_num_seqs=32, logits_processors=[SamplechainLogitsProcessor])


def decode(llm, batch: int, ours: bool) -> tuple[float, float]:
    """(ms per decode step, generated tok/s) for ``batch`` concurrent requests of MAX_TOKENS tokens each."""
    from vllm import SamplingParams

    prompts = [{"prompt_token_ids": [100 + 7 * i + j for j in range(16)]} for i in range(batch)]
    if ours:
        params = [SamplingParams(max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, extra_args={"seed": i})
                  for i in range(batch)]
    else:
        params = [SamplingParams(max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, top_k=40, top_p=0.95, min_p=0.05,
                                 temperature=0.8) for _ in range(batch)]
    best = None
    for _ in range(3):
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        n = sum(len(o.outputs[0].token_ids) for o in outs)
        best = wall if best is None else min(best, wall)
    return best / MAX_TOKENS * 1000, n / best


def main() -> None:
    import torch

    model_dir = build(Path(os.environ.get("TINY_LLAMA", "/tmp/samplechain-tiny-llama")))
    print(f"vLLM CPU, torch {torch.__version__}, threads {torch.get_num_threads()}; vocab {N_VOCAB}; "
          f"llama.cpp's default chain per request; {MAX_TOKENS} tokens per request")
    proc_ms = {b: processor_step_ms(b) for b in SIZES}
    llm = engine(model_dir)
    decode(llm, 2, True)  # warm-up
    rows = []
    for b in SIZES:
        vllm_ms, vllm_tps = decode(llm, b, False)
        ours_ms, ours_tps = decode(llm, b, True)
        rows.append((b, proc_ms[b], vllm_ms, ours_ms, ours_ms / vllm_ms, vllm_tps, ours_tps, ours_tps / vllm_tps))
    print(f"{'rows':>5} {'apply ms':>9} {'vllm step':>10} {'ours step':>10} {'step ratio':>11} "
          f"{'vllm tok/s':>11} {'ours tok/s':>11} {'tok/s ratio':>12}")
    for b, p, vm, om, r, vt, ot, tr in rows:
        print(f"{b:>5} {p:>9.3f} {vm:>10.2f} {om:>10.2f} {r:>11.2f} {vt:>11.1f} {ot:>11.1f} {tr:>12.2f}")


if __name__ == "__main__":
    main()
