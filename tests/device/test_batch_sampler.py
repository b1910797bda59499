"""BatchSampler: the tokens of every row are its CPU chain's tokens, whatever shares the batch."""

import math

import numpy as np
import pytest
import torch

from samplechain import (
    XTC,
    Chain,
    CommonSampler,
    Dist,
    DynamicTemperature,
    Greedy,
    LogitBias,
    MinP,
    MirostatV2,
    Penalties,
    SamplingParams,
    Temperature,
    TopK,
    TopNSigma,
    TopP,
    Typical,
)
from samplechain.device import BatchSampler
from samplechain.samplers import selectors

V = 49152

CHAINS = {
    "default": lambda s: CommonSampler(SamplingParams(seed=s)),
    "per-row k/p/t": lambda s: Chain([TopK(20 + 7 * s), TopP(0.8 + 0.02 * s), MinP(0.05), Temperature(0.6 + 0.1 * s),
                                      Dist(s)]),
    "penalties first": lambda s: Chain([Penalties(64, 1.3, 0.2, 0.1), TopK(50), Temperature(1.5), Dist(s)]),
    "penalties after top-k": lambda s: Chain([TopK(60), Penalties(32, 1.5, 0.5, 0.5), TopP(0.9), Dist(s)]),
    "logit bias + min-p": lambda s: Chain([LogitBias(V, {13: 5.0, 17: -math.inf, 198: 2.5}), MinP(0.02),
                                           Temperature(0.9), Dist(s)]),
    "top-p on the vocabulary": lambda s: Chain([TopP(0.9), Dist(s)]),
    "flat top-p": lambda s: Chain([Temperature(2.5), TopP(0.99), Dist(s)]),
    "dynamic temperature": lambda s: Chain([TopK(40), DynamicTemperature(0.8, 0.5, 1.0 + s), Dist(s)]),
    "min-p min_keep sorted": lambda s: Chain([TopK(30), MinP(0.3, min_keep=5), Dist(s)]),
    "cpu suffix (mirostat)": lambda s: Chain([TopK(30), Temperature(0.8), MirostatV2(s, 5.0, 0.1)]),
    "typical, xtc after top-k": lambda s: Chain([TopK(50), Typical(0.9), XTC(0.5, 0.1, 1, s), Dist(s)]),
    "xtc always firing": lambda s: Chain([TopK(40), TopP(0.95), XTC(1.0, 0.05, 2, s), Temperature(0.8), Dist(s)]),
    "xtc on one candidate": lambda s: Chain([TopK(1), XTC(0.9, 0.1, 1, s), Dist(s)]),
    "top-n-sigma after top-k": lambda s: Chain([TopK(64), TopNSigma(1.0 + 0.2 * s), Temperature(0.7), Dist(s)]),
    "every narrow device form": lambda s: Chain([TopK(60), TopNSigma(2.0), Typical(0.95, 3), TopP(0.9),
                                                 XTC(0.7, 0.08, 2, s), MinP(0.02), Temperature(0.9), Dist(s)]),
    "cpu prefix break (top-n-sigma)": lambda s: Chain([TopNSigma(1.5), TopK(40), Dist(s)]),
    "temperature 0": lambda s: Chain([Temperature(0.0), Dist(s)]),
    "greedy": lambda s: Chain([Greedy()]),
    "top-k + greedy": lambda s: Chain([TopK(10), Temperature(0.5), Greedy()]),
    "huge top-k": lambda s: Chain([TopK(10**6), TopP(0.5), Dist(s)]),
}


def run_both(make, batches, b=6, steps=8, select_on_device=True):
    cpu = [make(s) for s in range(b)]
    dev = [make(s) for s in range(b)]
    bs = BatchSampler(dev, select_on_device=select_on_device)
    got, want = [], []
    for x in batches(b, steps):
        want.append([c.sample(x[i].numpy()) for i, c in enumerate(cpu)])
        got.append(bs.sample(x))
    return got, want, bs, cpu, dev


@pytest.mark.parametrize("name", list(CHAINS))
def test_tokens_equal_the_cpu_chains_on_real_logits(name, batches):
    got, want, _, cpu, dev = run_both(CHAINS[name], batches)
    assert got == want
    # and the chains' states agree: one more CPU step from each gives the same token
    x = batches(6, 9)[-1]
    assert [c.sample(x[i].numpy()) for i, c in enumerate(cpu)] == [c.sample(x[i].numpy()) for i, c in enumerate(dev)]


@pytest.mark.parametrize("name", ["default", "per-row k/p/t", "penalties first", "flat top-p"])
def test_hybrid_mode_draws_on_the_cpu_with_the_same_tokens(name, batches):
    got, want, bs, _, _ = run_both(CHAINS[name], batches, select_on_device=False)
    assert got == want
    assert all(" -> dist" in bs.describe(i) for i in range(len(bs)))


def test_typical_xtc_top_n_sigma_run_on_the_device_after_top_k():
    bs = BatchSampler([CHAINS["every narrow device form"](0), CHAINS["typical, xtc after top-k"](1),
                       CHAINS["cpu prefix break (top-n-sigma)"](2), Chain([XTC(0.5, 0.1, 1, 3), TopK(5), Dist(3)]),
                       Chain([TopK(5), XTC(0.5, 0.0, 1, 4), Dist(4)])])
    assert bs.describe(0) == ("logits -> +top-k -> +top-n-sigma -> +typical -> +top-p -> +xtc -> +min-p -> +temp "
                              "-> +dist")
    # xtc needs sorted rows (typical leaves them in score order); wide top-n-sigma, xtc with t = 0: the CPU
    assert bs.describe(1) == "logits -> +top-k -> +typical -> xtc -> dist"
    assert bs.prefix_lengths == [8, 2, 0, 0, 1]


def test_prefixes_and_groups():
    chains = [CHAINS["default"](0), CHAINS["per-row k/p/t"](1), CHAINS["per-row k/p/t"](2),
              CHAINS["cpu suffix (mirostat)"](3), CHAINS["cpu prefix break (top-n-sigma)"](4),
              Chain([TopK(5), LogitBias(V, {1: 1.0}), Dist(0)]), Chain([MinP(0.1, min_keep=3), Dist(0)])]
    bs = BatchSampler(chains)
    assert bs.prefix_lengths == [5, 5, 5, 2, 0, 1, 0]
    assert bs.n_groups == 4  # default (temp-ext), the two per-row chains together, mirostat's prefix, top-k
    assert bs.describe(3) == "logits -> +top-k -> +temp -> mirostat-v2"
    assert bs.describe(4) == "logits -> top-n-sigma -> top-k -> dist"


def test_a_row_does_not_depend_on_its_batch_mates(batches):
    xs = batches(5, 10)
    alone = BatchSampler([CHAINS["default"](42)])
    solo = [alone.sample(x[2:3])[0] for x in xs]
    mates = [CHAINS["flat top-p"](1), CHAINS["penalties first"](2), CHAINS["default"](42), CHAINS["greedy"](0),
             CHAINS["default"](7)]
    crowd = BatchSampler(mates)
    assert [crowd.sample(x)[2] for x in xs] == solo
    # the same seed in another row position, other mates: the same tokens again
    again = BatchSampler([CHAINS["default"](42), CHAINS["dynamic temperature"](3)])
    assert [again.sample(torch.stack([x[2], x[0]]))[0] for x in xs] == solo


PARAMS = {
    "default": {},
    "top-p on the vocabulary": dict(top_k=0, top_p=0.9),
    "min-p on the vocabulary": dict(top_k=0, top_p=1.0, min_p=0.05),
    "greedy": dict(temperature=0.0),
    "dynamic temperature": dict(dynatemp_range=0.5, top_k=30),
    "logit bias": dict(logit_bias=((13, 2.0), (198, -math.inf))),
    "typical": dict(typical_p=0.9, samplers="top_k;typ_p;top_p;min_p;temperature"),
    "mirostat (cpu suffix)": dict(mirostat=2, top_k=20),
}


@pytest.mark.parametrize("select_on_device", [True, False])
@pytest.mark.parametrize("name", list(PARAMS))
def test_candidates_and_top_probs_equal_the_cpu_step(name, select_on_device, batches):
    """After a device step, CommonSampler reports the candidates and probabilities a CPU step reports, bitwise."""
    cpu = [CommonSampler(SamplingParams(seed=s, **PARAMS[name])) for s in range(4)]
    dev = [CommonSampler(SamplingParams(seed=s, **PARAMS[name])) for s in range(4)]
    bs = BatchSampler(dev, select_on_device=select_on_device)
    for x in batches(4, 5):
        assert bs.sample(x) == [c.sample(x[i].numpy()) for i, c in enumerate(cpu)]
        for c, d in zip(cpu, dev, strict=True):
            want, got = c.candidates, d.candidates
            np.testing.assert_array_equal(got.ids, want.ids)
            np.testing.assert_array_equal(got.logits, want.logits)
            np.testing.assert_array_equal(got.probs, want.probs)
            assert (got.selected, got.sorted) == (want.selected, want.sorted)
            assert d.top_probs(8) == c.top_probs(8)
            assert len(d.top_probs(8)) >= 1


def test_a_row_sampler_other_than_common_sampler():
    """BatchSampler drives anything with the RowSampler protocol: samplers, cpu_only, sample, accept, record."""
    class Row:
        cpu_only = False

        def __init__(self, seed):
            self.chain = Chain([TopK(20), Temperature(0.7), Dist(seed)])
            self.samplers = self.chain.samplers
            self.accepted, self.recorded = [], []

        def sample(self, logits):
            return self.chain.sample(logits)

        def accept(self, token, is_generated=False):
            self.accepted.append((token, is_generated))
            self.chain.accept(token)

        def record(self, candidates):
            self.recorded.append(candidates)

    rows = [Row(s) for s in range(3)]
    x = torch.from_numpy(np.random.default_rng(0).normal(0, 3, (3, 500)).astype(np.float32))
    tokens = BatchSampler(rows).sample(x)
    assert tokens == [Chain([TopK(20), Temperature(0.7), Dist(s)]).sample(x[s].numpy()) for s in range(3)]
    assert [r.accepted for r in rows] == [[(t, True)] for t in tokens]
    assert [len(r.recorded[0]().ids) for r in rows] == [20, 20, 20]  # narrow rows: built on first read


def test_rows_too_close_to_call_are_redone_on_the_cpu(batches, monkeypatch):
    monkeypatch.setattr(selectors, "_DRAW_MARGIN", 2.0)  # every device draw is 'too close': all redone
    got, want, _, _, _ = run_both(CHAINS["per-row k/p/t"], batches, steps=4)
    assert got == want


def test_ties_at_the_top_k_cut_follow_llama_cpp(batches):
    x = np.full((3, 5000), -3.0, dtype=np.float32)
    x[:, 100:140] = 2.0  # 40 equal logits, top-k 25 keeps the 25 lowest ids
    x[1, 4000] = 2.0
    x[2, 7] = 9.0
    cpu = [Chain([TopK(25), Dist(s)]) for s in range(3)]
    dev = [Chain([TopK(25), Dist(s)]) for s in range(3)]
    bs = BatchSampler(dev)
    for _ in range(20):
        assert bs.sample(torch.from_numpy(x)) == [c.sample(x[i]) for i, c in enumerate(cpu)]


def test_masked_rows(batches):
    x = batches(2, 1)[0].clone()
    x[0, :] = -math.inf
    x[0, 77] = 1.0  # a single finite logit
    x[1, : V - 3] = -math.inf
    for make in (CHAINS["default"], CHAINS["logit bias + min-p"], CHAINS["temperature 0"]):
        cpu = [make(s) for s in range(2)]
        assert BatchSampler([make(s) for s in range(2)]).sample(x) == [c.sample(x[i].numpy())
                                                                       for i, c in enumerate(cpu)]


def test_every_logit_masked_is_an_error_and_changes_nothing():
    chain = Chain([TopK(3), Dist(5)])
    bs = BatchSampler([chain])
    with pytest.raises(ValueError, match="masked"):
        bs.sample(torch.full((1, 100), -math.inf))
    x = torch.arange(100, dtype=torch.float32)[None] / 10
    assert bs.sample(x) == [Chain([TopK(3), Dist(5)]).sample(x[0].numpy())]


def test_half_precision_logits(batches):
    x = batches(2, 1)[0].half()
    cpu = [CHAINS["default"](s) for s in range(2)]
    got = BatchSampler([CHAINS["default"](s) for s in range(2)]).sample(x)
    assert got == [c.sample(x[i].float().numpy()) for i, c in enumerate(cpu)]


def test_grammar_rows_sample_on_the_cpu(smol_vocab_params):
    vocab, params = smol_vocab_params
    cpu = CommonSampler(params, vocab)
    dev = CommonSampler(params, vocab)
    bs = BatchSampler([dev])
    assert bs.prefix_lengths == [0]
    rng = np.random.default_rng(0)
    for _ in range(6):
        x = rng.normal(0, 3, vocab.n_tokens).astype(np.float32)
        assert bs.sample(torch.from_numpy(x)[None]) == [cpu.sample(x)]


@pytest.fixture(scope="module")
def smol_vocab_params(smol):
    return smol.vocab, SamplingParams(seed=3, grammar='root ::= "yes" | "no" | [0-9]+')


@pytest.mark.parametrize("bad, message", [
    (np.zeros((2, 10), dtype=np.float32), "torch.Tensor"),
    (torch.zeros(3, 10), r"shape \[2, n_vocab\]"),
    (torch.zeros(2), "shape"),
    (torch.zeros(2, 0), "shape"),
    (torch.zeros(2, 10, dtype=torch.int32), "floating point"),
    (torch.tensor([[0.0, 1.0], [float("nan"), 0.0]]), "row 1 contains NaN"),
    (torch.tensor([[0.0, float("inf")], [0.0, 0.0]]), "row 0 contains NaN or \\+inf"),
])
def test_bad_logits(bad, message):
    chains = [Chain([TopK(2), Dist(1)]), Chain([Temperature(0.5), Dist(2)])]
    bs = BatchSampler(chains)
    with pytest.raises(ValueError, match=message):
        bs.sample(bad)
    x = torch.tensor([[0.0, 1.0], [2.0, 0.0]])  # the generators were rewound: same tokens as fresh chains
    fresh = [Chain([TopK(2), Dist(1)]), Chain([Temperature(0.5), Dist(2)])]
    assert bs.sample(x) == [c.sample(x[i].numpy()) for i, c in enumerate(fresh)]


def test_bad_construction():
    c = Chain([Dist(1)])
    with pytest.raises(ValueError, match="own chain"):
        BatchSampler([c, c])
    with pytest.raises(ValueError, match="sequence"):
        BatchSampler(c)
    with pytest.raises(ValueError, match="empty"):
        BatchSampler([])
    with pytest.raises(ValueError, match="Chain or CommonSampler"):
        BatchSampler([Dist(1)])
    with pytest.raises(ValueError, match="device"):
        BatchSampler([c], device="no-such-device")
    with pytest.raises(ValueError, match="on cpu, the sampler on meta"):
        BatchSampler([c], device="meta").sample(torch.zeros(1, 4))


def test_no_selector_is_an_error():
    bs = BatchSampler([Chain([TopK(3)])])
    with pytest.raises(ValueError, match="no sampler selected"):
        bs.sample(torch.zeros(1, 10))


def test_logit_bias_outside_the_vocabulary():
    bs = BatchSampler([Chain([LogitBias(None, {50: 1.0}), Dist(0)])])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        bs.sample(torch.zeros(1, 10))


def test_process_equals_the_cpu_prefix(batches):
    x = batches(4, 1)[0]
    chains = [CHAINS[n](s) for s, n in enumerate(["default", "penalties first", "logit bias + min-p", "flat top-p"])]
    for c in chains:
        for t in (11, 11, 500):
            c.accept(t)
    expected = []
    for i, c in enumerate(chains):
        ref = c.clone()
        from samplechain import Candidates

        cand = Candidates.from_logits(x[i].numpy())
        for s in (ref.chain if isinstance(ref, CommonSampler) else ref).samplers[:-1]:
            s.apply(cand)
        row = np.full(V, -np.inf, dtype=np.float32)
        row[cand.ids] = cand.logits
        expected.append(row)
    out = BatchSampler(chains, select_on_device=False).process(x)
    np.testing.assert_array_equal(out.numpy(), np.stack(expected))


def test_process_refuses_cpu_only_samplers():
    with pytest.raises(ValueError, match="without a device form"):
        BatchSampler([Chain([TopK(5), MirostatV2(0, 5.0, 0.1)])]).process(torch.zeros(1, 10))
