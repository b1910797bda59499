"""After a context shift the logits equal a fresh evaluation of the kept tokens at their new positions."""

import numpy as np
import pytest
import torch

from samplechain import SamplingParams
from samplechain.runtime import Context

TEXT = ("In the beginning the universe was created. This has made a lot of people very angry and been widely "
        "regarded as a bad move. Many were increasingly of the opinion that they had all made a big mistake. ")


def _tokens(model, n):
    toks = model.tokenize(TEXT * (1 + n // 20), add_special=True)
    assert len(toks) >= n
    return toks[:n]


def _uniform_shift_and_compare(transformer, tokens, n_ctx, start, next_token):
    """Tokens decoded at positions start.., the whole sequence shifted back by start, one more token decoded:
    relative positions are unchanged, so every layer's keys, the sliding-window masks and the logits must equal a
    fresh evaluation at positions 0.."""
    n = len(tokens)
    ctx = Context(transformer, n_ctx)
    ctx.decode(tokens, positions=range(start, start + n), outputs=[False] * n)
    ctx.seq_add(0, -1, -1, -start)
    shifted = ctx.decode([next_token], positions=[n])[-1]
    fresh = Context(transformer, n_ctx).decode([*tokens, next_token])[-1]
    return shifted, fresh


def test_shift_equals_fresh_evaluation_llama(smol, dense_of):
    dense = dense_of(smol)
    tokens = _tokens(smol, 40)
    shifted, fresh = _uniform_shift_and_compare(dense, tokens, 64, 3000, tokens[10])
    torch.testing.assert_close(shifted, fresh, atol=2e-3, rtol=0)


@pytest.mark.slow
def test_shift_equals_fresh_evaluation_gemma3_sliding_window(gemma, dense_of):
    """600 tokens: the sliding-window layers (window 512, RoPE base 10k) mask the first ones, the global layers
    (base 1M) see all; both kinds of keys are re-rotated."""
    tokens = _tokens(gemma, 600)
    shifted, fresh = _uniform_shift_and_compare(dense_of(gemma), tokens, 640, 5000, tokens[7])
    assert (shifted - fresh).abs().max().item() < 5e-3


def test_context_shift_keeps_and_slides_positions(smol, dense_of):
    """llama.cpp's shift (n_keep, discard half): the kept prefix and the slid tail occupy positions 0..n-1 with no
    gap, and the next token goes right after them. (The tail's keys were computed while it attended to the
    discarded tokens, so its logits approximate, not equal, a fresh evaluation: that is llama.cpp's behaviour.)"""
    dense = dense_of(smol)
    tokens = _tokens(smol, 63)
    ctx = Context(dense, 64)
    ctx.decode(tokens, outputs=[False] * 63)
    assert ctx.context_shift(63, 5) == 34
    positions = ctx.kv.pos[ctx.kv.seq_positions(0)]
    assert positions.tolist() == list(range(34))
    assert ctx.kv.has_shift
    logits = ctx.decode([tokens[10]], positions=[34])[-1]
    fresh = Context(dense, 64).decode([*tokens[:5], *tokens[34:], tokens[10]])[-1]
    assert not ctx.kv.has_shift
    # control: the same shift with the keys left unrotated is further from the fresh evaluation
    control = Context(dense, 64)
    control.decode(tokens, outputs=[False] * 63)
    control.context_shift(63, 5)
    control.kv.take_shift()
    unrotated = control.decode([tokens[10]], positions=[34])[-1]

    def corr(a):
        return torch.corrcoef(torch.stack([a, fresh]))[0, 1].item()

    assert corr(logits) > 0.8 and corr(logits) > corr(unrotated)


def test_generation_runs_past_the_context(smol):
    params = SamplingParams(seed=7, ignore_eos=True)
    shifts = smol.context_shifts
    text = "".join(smol.generate("Count with me: one, two, three,", params, n_predict=120, n_ctx=64, n_keep=4))
    assert smol.context_shifts - shifts >= 2
    assert smol.timings.n_sample == 120 and len(text) > 100


def test_generation_stops_when_full_without_shift(smol):
    params = SamplingParams(seed=7, ignore_eos=True)
    "".join(smol.generate("Count with me: one, two, three,", params, n_predict=200, n_ctx=32, context_shift=False))
    n_prompt = smol.timings.n_prompt
    assert smol.timings.n_sample == 32 - n_prompt


def test_kv_shift_rotates_keys_like_fresh_positions(smol, dense_of):
    """K-shift alone: keys stored at positions p, shifted by -d, equal keys computed at p - d."""
    t = dense_of(smol)
    tokens = _tokens(smol, 20)
    ctx = Context(t, 32)
    ctx.decode(tokens, positions=np.arange(100, 120))
    ctx.seq_add(0, -1, -1, -100)
    t.apply_kv_shift(ctx.kv)
    fresh = Context(t, 32)
    fresh.decode(tokens)
    torch.testing.assert_close(ctx.kv.k[:, :, :20], fresh.kv.k[:, :, :20], atol=1e-4, rtol=1e-4)
