"""The processor driven directly with BatchUpdates built as vLLM's InputBatch builds them: chunked prefill (rows
whose token is thrown away), preemption (removed, later added back with its output ids), one-way moves and swaps
(condensing), ``n > 1`` children sharing one params object, plain rows left untouched."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm import SamplingParams as VSP
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from samplechain.integrations.vllm import SamplechainLogitsProcessor, request_params
from samplechain.params import CommonSampler

N = 49152


def make_proc():
    config = SimpleNamespace(speculative_config=None, model_config=SimpleNamespace(get_vocab_size=lambda: N))
    return SamplechainLogitsProcessor(config, torch.device("cpu"), False)


class Req:
    """A request as the engine holds it, and the reference CommonSampler fed only the rows that counted."""

    def __init__(self, vocab, prompt, extra, choice=0, params=None):
        self.params = params or VSP(extra_args=extra)
        self.prompt = prompt
        self.out: list[int] = []
        self.ref = CommonSampler(request_params(extra, None, choice), vocab, n_vocab=N)
        for t in prompt:
            self.ref.accept(t, is_generated=False)


def step(proc, gen, rows, keep):
    """One engine step over ``rows`` (index -> Req or None for a plain row); ``keep``: the indices whose sampled
    token is kept (the others are chunked-prefill rows). Checks each kept token against the reference."""
    logits = torch.randn(len(rows), N, generator=gen) * 3
    before = logits.clone()
    out = proc.apply(logits)
    for i, req in enumerate(rows):
        if req is None:
            assert torch.equal(out[i], before[i])  # plain rows are left untouched
            continue
        finite = torch.isfinite(out[i]).nonzero()[:, 0].tolist()
        assert len(finite) == 1 and out[i, finite[0]] == 0.0
        if i in keep:
            expected = req.ref.sample(before[i].numpy())
            assert finite[0] == expected
            req.out.append(finite[0])


def added(index, req):
    return (index, req.params, list(req.prompt), req.out)


def test_chunked_prefill_preemption_moves(vocab):
    proc = make_proc()
    gen = torch.Generator().manual_seed(0)
    a = Req(vocab, [5, 6, 7], {"seed": 1, "top_k": 20})
    b = Req(vocab, [8, 9], {"seed": 2, "mirostat": 2})
    c = Req(vocab, [10, 11], {"seed": 3, "xtc_probability": 1.0, "xtc_threshold": 0.01, "dry_multiplier": 1.0})
    plain = SimpleNamespace(params=VSP(temperature=0), prompt=[1], out=[])
    proc.update_state(BatchUpdate(3, [], [added(0, a), added(1, b), added(2, plain)], []))
    step(proc, gen, [a, b, None], keep={1})  # a still prefilling: its draw is thrown away
    step(proc, gen, [a, b, None], keep={1})
    proc.update_state(None)
    for _ in range(3):
        step(proc, gen, [a, b, None], keep={0, 1})
    # b is preempted; c arrives and takes index 1 in the same step; then the batch is condensed (2 -> 1... swap)
    proc.update_state(BatchUpdate(3, [1], [added(1, c)], [(1, 2, MoveDirectionality.SWAP)]))
    step(proc, gen, [a, None, c], keep={0})  # c prefilling
    for _ in range(2):
        step(proc, gen, [a, None, c], keep={0, 2})
    # the plain request finishes; c moves down to fill its slot (one-way move); b comes back with its tokens
    proc.update_state(BatchUpdate(3, [1], [], [(2, 1, MoveDirectionality.UNIDIRECTIONAL)]))
    proc.update_state(BatchUpdate(3, [], [added(2, b)], []))
    step(proc, gen, [a, c, b], keep={0, 1})  # b recomputes its prompt and tokens: a thrown-away row
    for _ in range(3):
        step(proc, gen, [a, c, b], keep={0, 1, 2})
    assert (len(a.out), len(b.out), len(c.out)) == (10, 8, 6)


def test_children_share_params_and_get_seed_plus_i(vocab):
    proc = make_proc()
    gen = torch.Generator().manual_seed(1)
    shared = VSP(n=1, extra_args={"seed": 40, "top_p": 0.9})
    kids = [Req(vocab, [3, 4], {"seed": 40, "top_p": 0.9}, choice=i, params=shared) for i in range(3)]
    proc.update_state(BatchUpdate(3, [], [added(i, k) for i, k in enumerate(kids)], []))
    for _ in range(4):
        step(proc, gen, kids, keep={0, 1, 2})
    assert [k.ref.seed for k in kids] == [40, 41, 42]


def test_same_seed_same_tokens_whatever_the_batch(vocab):
    rows = torch.randn(6, N, generator=torch.Generator().manual_seed(2)) * 3
    picks = []
    for others in (0, 5):
        proc = make_proc()
        me = Req(vocab, [1, 2], {"seed": 99, "top_k": 40, "temperature": 0.8})
        crowd = [Req(vocab, [7], {"seed": s, "min_p": 0.1}) for s in range(others)]
        proc.update_state(BatchUpdate(1 + others, [], [added(i, r) for i, r in enumerate([*crowd, me])], []))
        got = []
        for step_no in range(6):
            x = torch.randn(1 + others, N, generator=torch.Generator().manual_seed(100 + step_no)) * 3
            x[others] = rows[step_no]
            out = proc.apply(x)
            token = int(torch.argmax(out[others]))
            got.append(token)
            for r, row in zip([*crowd, me], out, strict=True):
                r.out.append(int(torch.argmax(row)))
        picks.append(got)
    assert picks[0] == picks[1]


def test_speculative_decoding_is_refused():
    config = SimpleNamespace(speculative_config=object(), model_config=SimpleNamespace(get_vocab_size=lambda: N))
    with pytest.raises(ValueError, match="speculative decoding"):
        SamplechainLogitsProcessor(config, torch.device("cpu"), False)


def test_entry_point_is_registered():
    from importlib.metadata import entry_points

    eps = {e.name: e.value for e in entry_points(group="vllm.logits_processors")}
    assert eps["samplechain"] == "samplechain.integrations.vllm:SamplechainLogitsProcessor"


def test_vocab_from_the_hf_tokenizer_matches_llama_cpp(model_dir, vocab):
    from transformers import AutoTokenizer

    from samplechain.integrations.vllm_vocab import vocab_from_hf

    hf = vocab_from_hf(AutoTokenizer.from_pretrained(model_dir), N + 64, [2])
    assert hf.n_tokens == N + 64
    assert [hf.token_bytes(i) for i in range(N)] == [vocab.token_bytes(i) for i in range(N)]
    assert hf.special >= set(range(N, N + 64)) and 2 in hf.eog
    assert np.array_equal(hf.tokenize("Hello world, 12"), vocab.tokenize("Hello world, 12"))
