"""Every architecture we run against llama.cpp's own logits on tiny random-weight models (``tests/model_fixtures``):
Llama 3 (rope_freqs), Mistral (SentencePiece), Qwen 2 (biases), Qwen 3 (q/k norms), Phi-3 (fused matrices, rope
factors), Gemma 2 (soft-capping, sliding windows) and Gemma 3, each as F16 and as llama.cpp quantized it to Q8_0,
Q4_K_M and Q6_K, on the torch reference path, on every compiled kernel variant this CPU runs, and on CUDA (float32
weights; eager and replayed graphs, a prompt batch and decode steps) where a GPU is present.

Two references per quantized file:
- llama.cpp on the same weights dequantized to F32 (its float path): the same arithmetic up to rounding, so top-1
  agrees on every position and the logits within ``EXACT_BOUND`` of the spread;
- llama.cpp on the quantized file itself, whose matrix products quantize activations to 8 bits (ours keep 16 bits,
  ~100x closer to the exact product): the logits within ``QUANT_BOUND`` of the spread, and top-1 equal on at least
  as many positions as llama.cpp's own float path is on the same weights (measured: 18 of the 21 files agree on all
  40 positions; llama3 Q8_0 and phi3 Q4_K_M on 39 and llama3 Q4_K_M on 36, exactly where llama.cpp's float path
  and its 8-bit-activation path disagree with each other).
"""

import numpy as np
import pytest
import torch

from model_fixtures import FAMILIES, N_TOKENS, files, reference, write_f16
from samplechain.gguf import GGUFFile
from samplechain.runtime import cpu_engine
from samplechain.runtime.kernels import build_candidate
from samplechain.runtime.model import ModelConfig, Transformer
from samplechain.runtime.weights import WeightLoader

EXACT_BOUND = 0.002  # max |ours - llama.cpp's float path| / logit spread
QUANT_BOUND = 0.015  # max |ours - llama.cpp's quantized path| / logit spread
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CUDA_KERNELS = ["cuda-eager", "cuda-graph"]
CPU_KERNELS = ["torch-dense", *(f"c-{isa}" for isa in cpu_engine.supported_isas())]
KERNELS = [*CPU_KERNELS, *(pytest.param(k, marks=needs_cuda) for k in CUDA_KERNELS)]


def transformer(path, kernel):
    """The file's model on ``kernel``: CUDA kernels hold float32 weights on the GPU."""
    g = GGUFFile(path)
    device = torch.device("cuda") if kernel in CUDA_KERNELS else None
    loader = WeightLoader(g, int4=kernel != "torch-dense", device=device)
    return build_candidate(Transformer(ModelConfig.from_gguf(g), loader), kernel)


def logits(path, tokens, kernel):
    t = transformer(path, kernel)
    n = len(tokens)
    return t.forward(t.new_cache(64), tokens, np.arange(n), [(0,)] * n, np.ones(n, dtype=bool)).cpu().numpy()


def spread(ref):
    return float(ref.max() - ref.min())


@pytest.fixture(scope="module")
def f16_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("f16")
    out = {}
    for family in FAMILIES:
        path = folder / f"{family.name}-F16.gguf"
        sha = write_f16(family, path)
        # the generator still writes the very file llama.cpp evaluated
        assert sha == reference(family)["f16_sha256"], family.name
        out[family.name] = path
    return out


@pytest.mark.parametrize("kernel", CPU_KERNELS)  # CUDA runs float32 weights: the quantized files below cover it, and
@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)  # they need no llama.cpp tree (the F16 one does)
def test_f16_matches_llama_cpp(family, kernel, f16_files):
    ref = reference(family)
    expected = ref["logits"]["F16"]
    ours = logits(f16_files[family.name], ref["tokens"], kernel)
    assert ours.shape == expected.shape == (N_TOKENS, expected.shape[1])
    np.testing.assert_array_equal(ours.argmax(-1), expected.argmax(-1))
    assert np.abs(ours - expected).max() <= EXACT_BOUND * spread(expected)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K_M", "Q6_K"])
@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_quantized_matches_llama_cpp(family, qtype, kernel):
    ref = reference(family)
    ours = logits(files(family)[qtype], ref["tokens"], kernel)
    exact = ref["logits"][f"{qtype}_F32"]
    np.testing.assert_array_equal(ours.argmax(-1), exact.argmax(-1))
    assert np.abs(ours - exact).max() <= EXACT_BOUND * spread(exact)
    quant = ref["logits"][qtype]
    bound = QUANT_BOUND * spread(quant)
    assert np.abs(ours - quant).max() <= bound
    # top-1 agrees with llama.cpp's quantized run wherever llama.cpp's own float path does
    assert (ours.argmax(-1) == quant.argmax(-1)).sum() >= (exact.argmax(-1) == quant.argmax(-1)).sum()


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_compiled_engine_is_batch_invariant(family):
    """One prompt batch, then the same tokens decoded one by one and in uneven chunks: the same bits."""
    ref = reference(family)
    tokens = ref["tokens"]
    g = GGUFFile(files(family)["Q4_K_M"])
    t = build_candidate(Transformer(ModelConfig.from_gguf(g), WeightLoader(g)), CPU_KERNELS[-1])
    n = len(tokens)
    whole = t.forward(t.new_cache(64), tokens, np.arange(n), [(0,)] * n, np.ones(n, dtype=bool)).numpy()
    cache = t.new_cache(64)
    parts, start = [], 0
    for size in (1, 5, 2, 8, 1, 16, 7):
        end = min(n, start + size)
        parts.append(t.forward(cache, tokens[start:end], np.arange(start, end), [(0,)] * (end - start),
                               np.ones(end - start, dtype=bool)).numpy())
        start = end
    assert start == n
    np.testing.assert_array_equal(np.concatenate(parts), whole)


@needs_cuda
@pytest.mark.parametrize("kernel", CUDA_KERNELS)
@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_cuda_decode_steps_match_llama_cpp(family, kernel):
    """Eight prompt tokens in one batch, then one token per step (on ``cuda-graph`` each step a replayed graph,
    with sliding windows, soft-capping, biases, q/k norms and RoPE factors inside it): every step's logits are
    llama.cpp's on the same weights."""
    ref = reference(family)
    tokens, exact = ref["tokens"], ref["logits"]["Q8_0_F32"]
    t = transformer(files(family)["Q8_0"], kernel)
    cache, first = t.new_cache(64), 8
    rows = [t.forward(cache, tokens[:first], np.arange(first), [(0,)] * first, np.ones(first, dtype=bool))]
    for i in range(first, len(tokens)):
        rows.append(t.forward(cache, tokens[i:i + 1], np.array([i]), [(0,)], np.ones(1, dtype=bool)))
    ours = torch.cat(rows).cpu().numpy()
    np.testing.assert_array_equal(ours.argmax(-1), exact.argmax(-1))
    assert np.abs(ours - exact).max() <= EXACT_BOUND * spread(exact)


def test_rope_per_layer_as_llama_cpp_picks_it():
    """Phi-3's long factors past the original context, its attention factor on cos/sin (not on a K-shift's turn);
    Gemma's sliding layers on their own base and scale."""
    import torch

    phi3 = ModelConfig.from_gguf(GGUFFile(files(FAMILIES[4])["Q8_0"]))
    assert phi3.arch == "phi3" and phi3.n_ctx_orig == 4096 and phi3.rope_mscale == pytest.approx(1.19)
    short, long = phi3.rope(0, 4096), phi3.rope(0, 4097)
    assert short.factors == phi3.rope_factors and long.factors == phi3.rope_factors_long != short.factors
    turn = short.rotation(torch.tensor([3]), phi3.head_dim)
    assert torch.allclose(turn.abs(), torch.full_like(turn.abs(), 1.19))
    assert torch.allclose(short.rotation(torch.tensor([3]), phi3.head_dim, magnitude=False).abs(),
                          torch.ones(1, 1, phi3.head_dim // 2))
    gemma3 = ModelConfig.from_gguf(GGUFFile(files(FAMILIES[6])["Q8_0"]))
    assert gemma3.swa_layers == frozenset({0}) and gemma3.swa_window == 8
    assert (gemma3.rope(0).base, gemma3.rope(1).base) == (10000.0, 1000000.0)
    gemma2 = ModelConfig.from_gguf(GGUFFile(files(FAMILIES[5])["Q8_0"]))
    assert (gemma2.attn_softcap, gemma2.final_softcap, gemma2.swa_layers) == (50.0, 30.0, frozenset({0}))
