"""The compiled CPU engine: batch-invariant logits, identical kernel variants, closeness to the dequantized path,
exact weight forms; the kernel choice by measurement, its cache and its override."""

import numpy as np
import pytest
import torch

from samplechain.cli import main
from samplechain.runtime import Context, load_model
from samplechain.runtime import kernels as K
from samplechain.runtime.cpu_engine import CEngine, EngineUnavailable, supported_isas
from samplechain.runtime.generation import resolve_device
from samplechain.runtime.weights import q4_unpack, q8_unpack

TEXT = {
    "smollm2": "The quick brown fox jumps over the lazy dog. In 1492, Columbus sailed the ocean blue",
    "gemma3-270m": "Il était une fois une princesse qui vivait dans un château. 東京は日本の首都です。",
}
OTHER = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n# and more text here"


# SmolLM2 runs the same kernels
@pytest.fixture(scope="module", params=["smollm2", pytest.param("gemma3-270m", marks=pytest.mark.slow)])
def engine_model(request, smol, gemma):
    model = smol if request.param == "smollm2" else gemma
    t = model.transformer
    return request.param, model, t.with_engine(CEngine(t, supported_isas()[-1]), "c-test")


def _alone(t, tokens, n_ctx=256):
    ctx = Context(t, n_ctx)
    return torch.stack([ctx.decode([tok])[-1] for tok in tokens])


def test_default_cpu_kernel_is_the_compiled_engine(smol, gemma):
    assert smol.transformer.kernel.startswith("c-") and gemma.transformer.kernel.startswith("c-")
    assert smol.timings.kernel == smol.transformer.kernel
    assert f"kernel = {smol.transformer.kernel}" in smol.timings.report()


@pytest.mark.parametrize("batch", [3, 17])
def test_logits_are_batch_invariant(engine_model, batch):
    """A token's logits are bitwise the same alone, inside its own prompt batch, and beside `batch - 1` other
    sequences at other positions (every row of the batch is an output)."""
    name, model, t = engine_model
    tokens = model.tokenize(TEXT[name])[:20]
    others = model.tokenize(OTHER * 2)
    alone = _alone(t, tokens)
    prompt = Context(t, 256).decode(tokens, outputs=[True] * len(tokens))
    assert torch.equal(prompt, alone)
    ctx = Context(t, 512, n_seq_max=batch)
    rows = []
    for i, tok in enumerate(tokens):
        toks, pos, seqs = [], [], []
        for s in range(1, batch):  # neighbours at other positions, some several tokens per step
            for j in range(1 + (s + i) % 2):
                toks.append(others[(7 * s + 2 * i + j) % len(others)])
                pos.append(ctx.seq_pos_max(s) + 1 + j)
                seqs.append(s)
        where = (i * 5) % (len(toks) + 1)
        toks.insert(where, tok)
        pos.insert(where, i)
        seqs.insert(where, 0)
        logits = ctx.decode(toks, positions=pos, seq_ids=seqs, outputs=[True] * len(toks))
        rows.append(logits[where])
    assert torch.equal(torch.stack(rows), alone)


@pytest.fixture(scope="module")
def long_alone(engine_model):
    """70 tokens of text, each decoded alone (one forward per token) on the 16-bit and on the 8-bit kernels."""
    name, model, t = engine_model
    tokens = (model.tokenize(TEXT[name] + OTHER) * 4)[:70]
    q8 = t.with_engine(CEngine(t, supported_isas(q8=True)[-1]), "c-q8")
    return tokens, {"16-bit": (t, _alone(t, tokens, 128)), "8-bit": (q8, _alone(q8, tokens, 128))}


@pytest.mark.parametrize("n", [2, 5, 8, 16, 33, 64])
@pytest.mark.parametrize("family", ["16-bit", "8-bit"])
def test_prompt_batches_of_any_size_are_bitwise_one_token_at_a_time(long_alone, n, family):
    """A batch of n tokens (prompt chunks, verify batches) gives every row the bits of decoding one token at a time,
    after a prefix in the cache (the multi-token kernels' token groups and weight chunks change nothing)."""
    tokens, runs = long_alone
    t, alone = runs[family]
    ctx = Context(t, 128)
    prefix = 70 - n
    ctx.decode(tokens[:prefix], outputs=[False] * prefix)
    got = ctx.decode(tokens[prefix:], outputs=[True] * n)
    assert torch.equal(got, alone[prefix:])


def test_split_batches_equal_one_batch(engine_model):
    name, model, t = engine_model
    tokens = model.tokenize(TEXT[name])
    one = Context(t, 256).decode(tokens, outputs=[True] * len(tokens))
    split = Context(t, 256, n_batch=5).decode(tokens, outputs=[True] * len(tokens))
    assert torch.equal(one, split)


def test_long_prompts_pass_the_feed_forward_in_chunks_with_the_same_bits(engine_model):
    """600 tokens in one forward run the feed-forward 64 tokens at a time (its buffers stay small): every row has
    the bits of the same tokens in forwards of 100."""
    name, model, t = engine_model
    tokens = (model.tokenize(TEXT[name] + OTHER) * 40)[:600]
    outputs = [i % 37 == 0 or i >= 597 for i in range(600)]
    one = Context(t, 1024).decode(tokens, outputs=outputs)
    split = Context(t, 1024, n_batch=100).decode(tokens, outputs=outputs)
    assert one.shape[0] == sum(outputs) and torch.equal(one, split)


@pytest.mark.parametrize("n", [65, 129])
def test_a_one_token_last_feed_forward_pass_has_the_bits_of_its_token(engine_model, n):
    """n = 64 k + 1 tokens: the feed-forward's last pass is one token of n_ff inputs, through the one-token path,
    whose byte buffers are sized for n_ff (they once took the rows' shared width, smaller than n_ff at 129 tokens of
    SmolLM2, and were overrun); every row has the bits of forwards of 10."""
    name, model, t = engine_model
    tokens = (model.tokenize(TEXT[name] + OTHER) * 40)[:n]
    one = Context(t, 256).decode(tokens, outputs=[True] * n)
    split = Context(t, 256, n_batch=10).decode(tokens, outputs=[True] * n)
    assert one.shape[0] == n and torch.equal(one, split)


def test_kernel_variants_give_the_same_bits(engine_model):
    name, model, t = engine_model
    tokens = model.tokenize(TEXT[name])[:12]
    results = [Context(t.with_engine(CEngine(t, isa), isa), 64).decode(tokens, outputs=[True] * len(tokens))
               for isa in supported_isas()]
    assert len(results) >= 1 and "generic" in supported_isas()
    for r in results[1:]:
        assert torch.equal(r, results[0])


def test_close_to_the_dequantized_reference(engine_model, dense_of):
    """16-bit activations: far inside the accuracy bound, and the top token of the dequantized model."""
    name, model, t = engine_model
    tokens = model.tokenize(TEXT[name])
    ours = Context(t, 256).decode(tokens, outputs=[True] * len(tokens))
    ref = Context(dense_of(model), 256).decode(tokens, outputs=[True] * len(tokens))
    assert (ours - ref).abs().max().item() <= 0.002 * ref.abs().max().item()
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_linear_kernel_matches_its_definition(smol):
    """One linear: activations quantized to int16 per 32-block (d = amax/32767), integer block dot products, exact
    against a float64 evaluation of the same definition up to float32 accumulation."""
    lin = smol.transformer.layers[3].gate_up
    x = np.random.default_rng(0).standard_normal((5, 576)).astype(np.float32)
    blocks = x.reshape(5, -1, 32)
    amax = np.abs(blocks).max(-1, keepdims=True)
    d = amax / np.float32(32767)
    xq = np.round(blocks * (np.float32(32767) / amax)).astype(np.float64)
    q, wd, wm = lin.q4
    w = (q.reshape(q.shape[0], -1, 32).astype(np.float64) * wd[..., None] + wm[..., None])
    want = np.einsum("ibk,obk->io", xq * d, w)
    for isa in supported_isas():
        got = CEngine(smol.transformer, isa).linear(lin, x)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())


def test_8bit_forms_are_exact(gemma):
    """Q8_0 and Q5_0 kept as int8 with per-block scales equal the gguf package's dequantization."""
    g = gemma.gguf
    for kind in ("Q8_0", "Q5_0"):
        name = next(n for n in g.tensors if g.info(n).type_name == kind and n.startswith("blk."))
        q, d = q8_unpack(g.raw(name), kind)
        w = q.astype(np.float32).reshape(q.shape[0], -1, 32) * d[..., None]
        np.testing.assert_array_equal(w.reshape(q.shape), g.dequantize(name).reshape(q.shape))


def test_q4_k_maps_exactly_onto_the_4bit_form(gemma):
    """Q4_K's sub-blocks are 4-bit values with a float32-exact scale (d * sc) and minimum (-dmin * m)."""
    from samplechain.runtime.weights import q4k_unpack

    g = gemma.gguf
    names = [n for n in g.tensors if g.info(n).type_name == "Q4_K"]
    assert len(names) == 27  # every attn_output and half of the ffn_down matrices
    q, d, m = q4k_unpack(g.raw(names[0]))
    assert q.max() <= 15
    w = q.astype(np.float32).reshape(q.shape[0], -1, 32) * d[..., None] + m[..., None]
    np.testing.assert_array_equal(w.reshape(q.shape), g.dequantize(names[0]).reshape(q.shape))
    assert gemma.transformer.layers[0].wo.q4 is not None  # runs on the 4-bit kernels


def test_4bit_form_is_exact(smol):
    g = smol.gguf
    q, d, m = q4_unpack(g.raw("blk.0.ffn_up.weight"), "Q4_1")
    w = q.astype(np.float32).reshape(q.shape[0], -1, 32) * d[..., None] + m[..., None]
    np.testing.assert_allclose(w.reshape(q.shape), g.dequantize("blk.0.ffn_up.weight").reshape(q.shape),
                               rtol=0, atol=1e-6)


def test_unknown_variant_and_cuda_tensors_are_refused(smol):
    with pytest.raises(ValueError, match="unknown kernel variant"):
        CEngine(smol.transformer, "avx1024")


# --- the choice by measurement ------------------------------------------------------------------------------------

@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SAMPLECHAIN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SAMPLECHAIN_KERNEL", raising=False)
    return tmp_path


def test_choice_is_measured_once_and_cached(smol, kernel_cache, monkeypatch):
    base = smol.transformer
    chosen = K.choose_kernel(base)
    entry = next(iter(K._read_cache().values()))
    assert entry["kernel"] == chosen.kernel
    assert chosen.kernel.startswith("c-")  # the batch-invariant engine wins here
    # only the compiled engine's variants are measured where it builds (no dequantized copy of the model)
    compiled = {n for n, (_build, invariant) in K.CPU_CANDIDATES.items() if invariant} - K.OPT_IN
    batch_ms = entry[f"batch{K.BATCH}_ms"]
    assert set(entry["decode_ms"]) == set(batch_ms) == compiled
    score = entry["score"]
    # a candidate this CPU cannot run (e.g. c-avx512 on an AVX2 machine) has a problem and no score; one dropped
    # after the quick round (tests/runtime/test_kernels.py) is listed as pruned, with its decode step only
    timed = [n for n in score if score[n] is not None]
    assert all((n in entry["problems"]) != (n in entry["pruned"]) for n in score if score[n] is None)
    assert all(entry["decode_ms"][n] is not None for n in entry["pruned"])
    # the pick: the lowest score, decode steps within DECODE_TIE of the fastest counted as the fastest
    compiled_timed = [n for n in timed if n.startswith("c-")]
    fastest = min(entry["decode_ms"][n] for n in compiled_timed)

    def tied(n):
        d = entry["decode_ms"][n]
        return (fastest if d <= fastest * (1 + K.DECODE_TIE) else d) + batch_ms[n] / K.BATCH

    assert tied(chosen.kernel) == min(tied(n) for n in compiled_timed)
    assert all(score[n] == pytest.approx(entry["decode_ms"][n] + batch_ms[n] / K.BATCH) for n in timed)

    def no_measuring(_t):
        raise AssertionError("measured again")

    monkeypatch.setattr(K, "measure", no_measuring)
    assert K.choose_kernel(base).kernel == chosen.kernel


def test_torch_paths_are_measured_against_the_reference_without_a_compiled_engine(monkeypatch):
    """On a tiny Llama 3 (tests/model_fixtures, Q4_K_M: 4-bit matrices for torch's int4 paths): the same candidates
    and checks as on SmolLM2, in a second rather than a minute."""
    from model_fixtures import FAMILIES, files
    from samplechain.gguf import GGUFFile
    from samplechain.runtime.model import ModelConfig, Transformer
    from samplechain.runtime.weights import WeightLoader

    g = GGUFFile(files(FAMILIES[0])["Q4_K_M"])
    tiny = Transformer(ModelConfig.from_gguf(g), WeightLoader(g))

    def unavailable(isa):
        def build(_t):
            raise EngineUnavailable(f"no {isa} here")
        return build

    compiled = ("c-amx", "c-avx512vnni", "c-avx2", "c-generic")
    table = {**K.CPU_CANDIDATES, **{n: (unavailable(n), True) for n in compiled}}
    monkeypatch.setattr(K, "CPU_CANDIDATES", table)
    trials = {r.name: r for r in K.measure(tiny)}
    assert set(trials) == set(table) - K.OPT_IN
    assert all(trials[n].problem == f"no {n} here" for n in compiled)
    assert trials["torch-dense"].error == 0.0 and trials["torch-dense"].agreement == 1.0
    assert trials["torch-int4-f32"].error is not None and trials["torch-int4-f32"].decode_ms is not None
    assert K.pick(list(trials.values())).name.startswith("torch-")


def test_pick_prefers_invariant_candidates_within_the_bound():
    trials = [K.Trial("torch-int4-bf16", 1.0, 0.01), K.Trial("c-avx2", 2.0, 0.02, invariant=True),
              K.Trial("c-generic", 1.5, 0.5, invariant=True, problem="outside the accuracy bound")]
    assert K.pick(trials).name == "c-avx2"
    assert K.pick(trials[:1]).name == "torch-int4-bf16"
    with pytest.raises(EngineUnavailable):
        K.pick(trials[2:])
    assert "<- chosen" in K.report(trials, "c-avx2")


def test_environment_overrides_the_choice(smol, kernel_cache, monkeypatch):
    monkeypatch.setenv("SAMPLECHAIN_KERNEL", "torch-int4-bf16")
    t = K.choose_kernel(smol.transformer)
    assert t.kernel == "torch-int4-bf16" and t.engine is None
    monkeypatch.setenv("SAMPLECHAIN_KERNEL", "c-generic")
    assert K.choose_kernel(smol.transformer).kernel == "c-generic"
    monkeypatch.setenv("SAMPLECHAIN_KERNEL", "fastest-please")
    with pytest.raises(ValueError, match="unknown kernel 'fastest-please'"):
        K.choose_kernel(smol.transformer)


def test_load_model_kernel_argument_and_cli(kernel_cache, capsys):
    model = load_model(kernel="torch-dense")
    assert model.transformer.kernel == "torch-dense"
    assert main(["generate", "-p", "Hi", "-n", "2", "--kernel", "nope"]) == 1
    err = capsys.readouterr().err.splitlines()  # "loading model ...", then the error
    assert len(err) == 2 and err[1].startswith("samplechain generate: error: unknown kernel 'nope'")


@pytest.mark.parametrize("device, message", [("tpu", "not supported|unknown device"), ("cuda:x", "unknown device")])
def test_bad_devices_are_one_line_errors(device, message):
    with pytest.raises(ValueError, match=message):
        resolve_device(device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_a_clear_error(capsys):
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda")
    assert main(["generate", "-p", "Hi", "-n", "2", "--device", "cuda"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "CUDA is not available" in err


def test_generate_reuses_its_context_but_never_shares_a_busy_one(smol):
    """The model's own context (and on CUDA its captured graphs) is kept across generate calls; two generations
    interleaved each get their own, and each gives the text it gives alone."""
    from samplechain import SamplingParams

    params = SamplingParams(seed=4)
    alone = ["".join(smol.generate(p, params, n_predict=12)) for p in ("Once upon a time", "The sea is")]
    assert "".join(smol.generate("Once upon a time", params, n_predict=12)) == alone[0]
    gens = [smol.generate(p, params, n_predict=12) for p in ("Once upon a time", "The sea is")]
    out, live = ["", ""], [True, True]
    while any(live):  # one piece from each in turn
        for i, g in enumerate(gens):
            if live[i]:
                try:
                    out[i] += next(g)
                except StopIteration:
                    live[i] = False
    assert out == alone


def test_activation_quantizer_paths_give_the_same_bits():
    """The AVX2 and AVX-512 quantizers are the generic one bit for bit: scales, int16 values (roundf's ties away
    from zero, the clamp) and block sums, on random rows and on the edges (zeros, exact ties, tiny and huge values,
    NaNs and infinities)."""
    import ctypes

    from samplechain.runtime.cpu_engine import library

    rng = np.random.default_rng(3)
    rows = [rng.standard_normal(4096).astype(np.float32) * s for s in (1e-30, 1e-3, 1.0, 1e4, 1e30)]
    ties = np.tile(np.array([32767.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999997], dtype=np.float32), 4)
    rows += [np.zeros(32, np.float32), ties, np.float32([1.0, -1.0] * 16), np.float32([-3.0] + [1.0] * 31)]
    odd = rng.standard_normal(128).astype(np.float32)
    odd[[3, 40, 77]] = np.nan
    odd[[9, 64]] = np.inf, -np.inf
    odd[100] = np.nan
    odd[101] = 5.0
    rows.append(odd)
    late = np.float32([5.0] + [0.5] * 7 + [np.nan] + [0.5] * 7 + [1.0] * 16)  # a NaN after its lane's maximum
    rows += [late, late[::-1].copy()]
    lib = library()
    ok = 0
    for x in rows:
        out = []
        for isa in (0, 1, 2):
            q = np.empty(x.size, np.int16)
            d = np.empty(x.size // 32, np.float32)
            s = np.empty(x.size // 32, np.int32)
            rc = lib.sc_quantize_row(ctypes.c_void_p(x.ctypes.data), x.size, ctypes.c_void_p(q.ctypes.data),
                                     ctypes.c_void_p(d.ctypes.data), ctypes.c_void_p(s.ctypes.data), isa)
            out.append((rc, q, d, s))
        if out[1][0] != 0:
            pytest.skip("no AVX2 on this CPU")
        ok += 1
        for other in out[1:]:
            if other[0] != 0:  # no AVX-512 on this CPU
                continue
            for a, b in zip(out[0][1:], other[1:], strict=True):
                np.testing.assert_array_equal(a, b)
    assert ok == len(rows)
    q = np.empty(32, np.int16)
    d, s = np.empty(1, np.float32), np.empty(1, np.int32)
    x = np.tile(np.float32([32767.0, 0.5, -0.5, 1.5]), 8)
    lib.sc_quantize_row(ctypes.c_void_p(x.ctypes.data), 32, ctypes.c_void_p(q.ctypes.data),
                        ctypes.c_void_p(d.ctypes.data), ctypes.c_void_p(s.ctypes.data), 0)
    assert q[:4].tolist() == [32767, 1, -1, 2] and d[0] == np.float32(1.0) and s[0] == 8 * (32767 + 1 - 1 + 2)


@pytest.fixture(scope="module")
def q8_isas():
    isas = supported_isas(q8=True)
    assert "generic-q8" in isas
    return isas


def test_8bit_activation_variants_give_the_same_bits_and_are_batch_invariant(engine_model, q8_isas):
    """The 8-bit family (llama.cpp's activation numerics): every variant the same bits, any batch size the same
    bits as one token at a time."""
    name, model, t = engine_model
    tokens = model.tokenize(TEXT[name] + OTHER)[:33]
    engines = [t.with_engine(CEngine(t, isa), isa) for isa in q8_isas]
    batch = [Context(e, 64).decode(tokens, outputs=[True] * len(tokens)) for e in engines]
    for r in batch[1:]:
        assert torch.equal(r, batch[0])
    assert torch.equal(_alone(engines[-1], tokens, 64), batch[0])


def test_8bit_activations_are_within_the_accuracy_bound(engine_model, dense_of):
    name, model, t = engine_model
    tokens = model.tokenize(TEXT[name])
    q8 = Context(t.with_engine(CEngine(t, "generic-q8"), "q8"), 256).decode(tokens, outputs=[True] * len(tokens))
    ref = Context(dense_of(model), 256).decode(tokens, outputs=[True] * len(tokens))
    err = (q8 - ref).abs().max().item() / ref.abs().max().item()
    assert 0.002 < err <= K.ACCURACY_BOUND  # coarser than the 16-bit kernels, as llama.cpp's
    assert (q8.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.75


def test_8bit_kernel_is_opt_in(smol, q8_isas):
    """Measured on request (speed and accuracy), never picked by measurement; chosen by name."""
    assert "c-avx2-q8" in K.OPT_IN
    trials = [K.Trial("c-avx2-q8", 1.0, 0.05, invariant=True, score=1.0),
              K.Trial("c-avx2", 2.0, 0.0, invariant=True, score=2.0)]
    assert K.pick(trials).name == "c-avx2"
    if "avx2-q8" in q8_isas:
        assert K.choose_kernel(smol.transformer, "c-avx2-q8").kernel == "c-avx2-q8"


def test_8bit_activation_quantizer_paths_give_the_same_bits():
    """quantize_row8 (d = amax/127, ties away from zero, two sums per block) on AVX2 equals the generic code."""
    import ctypes

    from samplechain.runtime.cpu_engine import library

    lib = library()
    rng = np.random.default_rng(5)
    rows = [rng.standard_normal(1024).astype(np.float32) * s for s in (1e-20, 1.0, 1e20)]
    rows += [np.zeros(32, np.float32), np.float32([127.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 63.5] * 4)]
    for x in rows:
        out = []
        for isa in (0, 1):
            q, d, s = np.empty(x.size, np.int8), np.empty(x.size // 32, np.float32), np.empty(x.size // 16, np.int32)
            rc = lib.sc_quantize_row8(ctypes.c_void_p(x.ctypes.data), x.size, ctypes.c_void_p(q.ctypes.data),
                                      ctypes.c_void_p(d.ctypes.data), ctypes.c_void_p(s.ctypes.data), isa)
            out.append((rc, q, d, s))
        assert out[0][0] == 0
        if out[1][0] != 0:
            pytest.skip("no AVX2 on this CPU")
        for a, b in zip(out[0][1:], out[1][1:], strict=True):
            np.testing.assert_array_equal(a, b)
    x = rows[-1]
    q, d, s = np.empty(32, np.int8), np.empty(1, np.float32), np.empty(2, np.int32)
    lib.sc_quantize_row8(ctypes.c_void_p(x.ctypes.data), 32, ctypes.c_void_p(q.ctypes.data),
                         ctypes.c_void_p(d.ctypes.data), ctypes.c_void_p(s.ctypes.data), 0)
    assert q[:8].tolist() == [127, 1, -1, 2, -2, 3, -3, 64] and d[0] == np.float32(1.0)
    assert s.tolist() == [2 * (127 + 1 - 1 + 2 - 2 + 3 - 3 + 64)] * 2
