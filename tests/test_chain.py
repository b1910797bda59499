"""Chain semantics (llama.cpp's llama_sampler_chain_*, src/llama-sampler.cpp)."""

import numpy as np
import pytest

from samplechain import Candidates, Chain, Dist, Greedy, MinP, Penalties, Sampler, Temperature, TopK, TopP

LOGITS = np.log(np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32))


class Recorder(Sampler):
    name = "recorder"

    def __init__(self):
        self.accepted = []
        self.applied = 0
        self.resets = 0

    def apply(self, c):
        self.applied += 1

    def accept(self, token):
        self.accepted.append(token)

    def reset(self):
        self.resets += 1


def test_sample_applies_in_order_and_accepts():
    rec = Recorder()
    chain = Chain([rec, TopK(2), Greedy()])
    assert chain.sample(LOGITS) == 3
    assert rec.applied == 1 and rec.accepted == [3]


def test_describe_names_and_placeholders():
    chain = Chain([TopK(40), TopP(1.0), Temperature(0.8), Dist(0)])
    assert chain.describe() == "logits -> top-k -> ?top-p -> temp -> dist"


def test_sample_without_selector_raises():
    with pytest.raises(ValueError, match="no sampler selected"):
        Chain([TopK(2)]).sample(LOGITS)


def test_add_remove_index_len_iter():
    chain = Chain()
    chain.add(TopK(2))
    chain.add(Greedy())
    assert len(chain) == 2 and chain[1].name == "greedy" and [s.name for s in chain] == ["top-k", "greedy"]
    removed = chain.remove(0)
    assert removed.name == "top-k" and len(chain) == 1
    with pytest.raises(ValueError):
        chain.add("top-k")


def test_perf_counts_accepts_and_time():
    chain = Chain([Greedy()], perf=True)
    for _ in range(3):
        chain.sample(LOGITS)
    chain.accept(1)  # a prompt token also counts, as in llama.cpp
    assert chain.perf.n_sample == 4 and chain.perf.t_sample_ms > 0
    chain.perf_reset()
    assert chain.perf.n_sample == 0


def test_perf_off_still_counts_accepts():
    chain = Chain([Greedy()])
    chain.sample(LOGITS)
    assert chain.perf.n_sample == 1 and chain.perf.t_sample_ms == 0.0


def test_reset_forwards_and_keeps_perf():
    rec = Recorder()
    chain = Chain([rec, Greedy()])
    chain.sample(LOGITS)
    chain.reset()
    assert rec.resets == 1 and chain.perf.n_sample == 1


def test_clone_is_independent():
    chain = Chain([Penalties(8, 1.0, 0.0, 5.0), Dist(42)])
    chain.sample(LOGITS)
    twin = chain.clone()
    a = [chain.sample(LOGITS) for _ in range(6)]
    b = [twin.sample(LOGITS) for _ in range(6)]
    assert a == b
    chain.accept(0)
    assert chain[0]._counts != twin[0]._counts


def test_same_seed_same_tokens():
    make = lambda: Chain([TopK(40), TopP(0.9), MinP(0.05), Temperature(0.7), Dist(1234)])  # noqa: E731
    rng = np.random.default_rng(0)
    rows = [rng.normal(0, 3, 1000).astype(np.float32) for _ in range(20)]
    a, b = make(), make()
    assert [a.sample(r) for r in rows] == [b.sample(r) for r in rows]


def test_seed_reports_last_dist():
    assert Chain([Dist(7), TopK(3), Dist(9)]).seed == 9
    assert Chain([TopK(3)]).seed is None


def test_candidates_token_requires_selection():
    c = Candidates.from_logits(LOGITS)
    with pytest.raises(ValueError, match="selected"):
        _ = c.token
