"""samplechain.integrations.transformers with a tiny randomly initialised transformers model."""

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from samplechain import Candidates, Chain, Dist, MinP, Penalties, SamplingParams, Temperature, TopK, TopP
from samplechain.integrations.transformers import SamplechainLogitsProcessor

VOCAB = 300


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


def test_scores_equal_the_cpu_chain_per_row():
    chain = Chain([Penalties(16, 1.3, 0.1, 0.1), TopK(40), TopP(0.9), MinP(0.05), Temperature(0.7), Dist(0)])
    proc = SamplechainLogitsProcessor(chain)
    rng = np.random.default_rng(1)
    input_ids = torch.from_numpy(rng.integers(3, VOCAB, (3, 12)))
    scores = torch.from_numpy(rng.normal(0, 3, (3, VOCAB)).astype(np.float32))
    out = proc(input_ids, scores)
    for i in range(3):
        ref = chain.clone()
        for t in input_ids[i].tolist():
            ref.accept(t)
        c = Candidates.from_logits(scores[i].numpy())
        for s in ref.samplers[:-1]:
            s.apply(c)
        row = np.full(VOCAB, -np.inf, dtype=np.float32)
        row[c.ids] = c.logits
        np.testing.assert_array_equal(out[i].numpy(), row)


def test_generate_with_top_k_1_is_greedy(tiny):
    prompt = torch.tensor([[1, 17, 42, 99], [1, 5, 6, 7]])
    greedy = tiny.generate(prompt, max_new_tokens=12, do_sample=False)
    proc = SamplechainLogitsProcessor(SamplingParams(top_k=1))
    sampled = tiny.generate(prompt, max_new_tokens=12, do_sample=True, logits_processor=[proc])
    assert torch.equal(greedy, sampled)


def test_penalties_follow_each_row_inside_generate(tiny):
    prompt = torch.tensor([[1, 17, 42, 99], [1, 5, 6, 7]])
    # a huge repeat penalty with top-k 1: no token of the window comes back while it is in the window
    proc = SamplechainLogitsProcessor(Chain([Penalties(64, 1e9, 0.0, 0.0), TopK(1), Dist(0)]))
    out = tiny.generate(prompt, max_new_tokens=20, do_sample=False, logits_processor=[proc])
    for row in out.tolist():
        assert len(set(row)) == len(row)
    plain = tiny.generate(prompt, max_new_tokens=20, do_sample=False)
    assert any(len(set(r)) < len(r) for r in plain.tolist())  # the random model repeats itself without it
    # a second generate() call starts with fresh row chains
    again = tiny.generate(prompt, max_new_tokens=20, do_sample=False, logits_processor=[proc])
    assert torch.equal(out, again)


def test_refuses_what_cannot_run_as_a_processor():
    with pytest.raises(ValueError, match="grammars and mirostat"):
        SamplechainLogitsProcessor(SamplingParams(mirostat=2))
    with pytest.raises(ValueError, match="Chain or SamplingParams"):
        SamplechainLogitsProcessor(TopK(3))
