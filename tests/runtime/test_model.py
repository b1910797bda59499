"""Logits against transformers' implementation of the same GGUF, the int4 kernel against the dequantized path,
batched multi-sequence decoding against separate decoding."""

import numpy as np
import pytest
import torch

from samplechain.runtime import Context, KVCacheFull

PROMPTS = {
    "smollm2": "<|im_start|>user\nWhat is the capital of France? Answer in one word.<|im_end|>\n"
               "<|im_start|>assistant\n",
    "gemma3-270m": "The quick brown fox jumps over the lazy dog. In 1492, Columbus sailed",
}


def _prompt(model, name):
    return model.tokenize(PROMPTS[name])


# transformers' Gemma: a minute to load
@pytest.fixture(scope="module", params=["smollm2", pytest.param("gemma3-270m", marks=pytest.mark.slow)])
def model_and_reference(request, smol, gemma, reference_models):
    model = smol if request.param == "smollm2" else gemma
    tokens = _prompt(model, request.param)
    with torch.no_grad():
        ref = reference_models(request.param)(torch.tensor([tokens])).logits[0]
    return request.param, model, tokens, ref


def _all_logits(transformer, tokens, n_ctx=256):
    cache = transformer.new_cache(n_ctx)
    n = len(tokens)
    return transformer.forward(cache, np.array(tokens), np.arange(n), [(0,)] * n, np.ones(n, dtype=bool))


def test_dequantized_path_matches_transformers(model_and_reference, dense_of):
    _name, model, tokens, ref = model_and_reference
    ours = _all_logits(dense_of(model), tokens)
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() < 2e-3
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_default_path_matches_transformers(model_and_reference):
    """The default path (int4 kernel, possibly with bfloat16 activations) stays close: same top tokens."""
    _name, model, tokens, ref = model_and_reference
    ours = _all_logits(model.transformer, tokens)
    scale = ref.abs().max().item()
    assert (ours - ref).abs().max().item() < 0.03 * scale
    agree = (ours.argmax(-1) == ref.argmax(-1)).float().mean().item()
    assert agree >= 0.9


def test_int4_kernel_in_float32_equals_dequantized(smol, dense_of):
    """Q4_1 maps exactly onto torch's int4 kernel: with float32 activations both paths agree to rounding."""
    tokens = _prompt(smol, "smollm2")[:12]
    exact = _all_logits(smol.transformer.with_int4_dtype(torch.float32), tokens)
    dense = _all_logits(dense_of(smol), tokens)
    assert (exact - dense).abs().max().item() < 1e-3


def test_outputs_only_for_marked_rows(smol):
    tokens = np.array(_prompt(smol, "smollm2")[:10])
    t = smol.transformer
    full = _all_logits(t, tokens)
    cache = t.new_cache(64)
    outputs = np.zeros(10, dtype=bool)
    outputs[[2, 9]] = True
    some = t.forward(cache, tokens, np.arange(10), [(0,)] * 10, outputs)
    assert some.shape == (2, smol.config.n_vocab)
    torch.testing.assert_close(some, full[[2, 9]], atol=1e-4, rtol=0)


def test_one_batch_of_several_sequences_equals_separate_decoding(any_model, dense_of):
    """Tokens of three sequences in one forward: attention is masked by sequence and position.
    (Dequantized weights: the bfloat16 int4 kernel's rounding depends on the batch shape.)"""
    model = any_model
    dense = dense_of(model)
    a = model.tokenize("The sky is blue and", add_special=True)
    b = model.tokenize("Paris is the capital of", add_special=True)
    c = model.tokenize("1, 2, 3,", add_special=True)
    separate = []
    for toks in (a, b, c):
        ctx = Context(dense, 128)
        separate.append(ctx.decode(toks)[-1])
    ctx = Context(dense, 128, n_seq_max=3)
    tokens = a + b + c
    positions = [*range(len(a)), *range(len(b)), *range(len(c))]
    seqs = [0] * len(a) + [1] * len(b) + [2] * len(c)
    outputs = [False] * len(tokens)
    for end in (len(a), len(a) + len(b), len(tokens)):
        outputs[end - 1] = True
    batched = ctx.decode(tokens, positions, seqs, outputs)
    for got, want in zip(batched, separate, strict=False):
        torch.testing.assert_close(got, want, atol=2e-3, rtol=0)
    # a further token for sequence 1 only sees sequence 1
    ctx2 = Context(dense, 128)
    want = ctx2.decode([*b, a[-1]])[-1]
    got = ctx.decode([a[-1]], [len(b)], [1])[-1]
    torch.testing.assert_close(got, want, atol=2e-3, rtol=0)


def test_split_prompt_batches_equal_one_batch(smol, dense_of):
    tokens = smol.tokenize("A long enough prompt, to be cut into several batches of three tokens each.")
    dense = dense_of(smol)
    one = Context(dense, 128).decode(tokens)[-1]
    split = Context(dense, 128, n_batch=3).decode(tokens)[-1]
    torch.testing.assert_close(split, one, atol=2e-3, rtol=0)


def test_bad_batches(smol):
    ctx = smol.new_context(16)
    with pytest.raises(ValueError, match="not in"):
        ctx.decode([49152])
    with pytest.raises(ValueError, match="at least one token"):
        ctx.decode([])
    with pytest.raises(ValueError, match="sequence id"):
        ctx.decode([1], seq_ids=[1])
    with pytest.raises(ValueError, match="positions"):
        ctx.decode([1, 2], positions=[0])
    with pytest.raises(KVCacheFull, match="full"):
        ctx.decode(list(range(100, 117)))
    ctx.decode(list(range(100, 116)))
    with pytest.raises(KVCacheFull, match="0 of 16 are free"):
        ctx.decode([5])
    with pytest.raises(ValueError, match="n_ctx"):
        smol.new_context(4)
