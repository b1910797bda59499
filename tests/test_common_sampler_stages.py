"""CommonSampler's stages and its stage observer: the sampling order written once (common_sampler_sample)."""

import numpy as np

from samplechain import CommonSampler, Sampler, SamplingParams, Vocab

# ids: 0 <think>, 1 </think>, 2 "a", 3 "b", 4 " ", 5 "Done", 6 ".", 7 <eos>
VOCAB = Vocab([b"<think>", b"</think>", b"a", b"b", b" ", b"Done", b".", b"<eos>"], special=[0, 1, 7], eog=[7])
# greedy picks "a" (2); without "a", "b" (3)
LOGITS = np.array([0.0, 0.0, 3.0, 2.0, 0.0, 1.0, 1.0, 0.0], dtype=np.float32)
THINK = dict(reasoning_budget_tokens=2, reasoning_budget_start_tag="<think>", reasoning_budget_end_tags=("</think>",))
CHAIN = ["top-k", "top-p", "min-p", "temp-ext", "dist"]


class RefuseA(Sampler):
    """A stand-in grammar without ``allows``: it refuses "a" (2)."""

    name = "grammar"

    def __init__(self, lazy=False):
        self.is_lazy = lazy

    def apply(self, c):
        c.set_logits(np.where(c.ids == 2, np.float32(-np.inf), c.logits))


def test_stages_are_the_budget_the_grammar_then_the_chain():
    g = RefuseA()
    s = CommonSampler(SamplingParams(**THINK), VOCAB, grammar=g)
    assert s.stages(with_grammar=False) == [s.reasoning_budget, *s.chain.samplers]
    assert s.stages(with_grammar=True) == [s.reasoning_budget, g, *s.chain.samplers]
    assert [x.name for x in s.stages(True)] == ["reasoning-budget", "grammar", *CHAIN]
    plain = CommonSampler(SamplingParams())
    assert plain.stages(with_grammar=True) == plain.chain.samplers  # no grammar, no budget: the chain alone


def test_grammar_applies_and_allows():
    plain = CommonSampler(SamplingParams())
    assert not plain.grammar_applies() and plain.grammar_allows(2)
    s = CommonSampler(SamplingParams(), VOCAB, grammar=RefuseA())
    assert s.grammar_applies() and not s.grammar_allows(2) and s.grammar_allows(3)
    lazy = CommonSampler(SamplingParams(**THINK, generation_prompt="<think>"), VOCAB, grammar=RefuseA(lazy=True))
    assert not lazy.grammar_applies()  # a lazy grammar waits while the thinking block is open


def test_observer_sees_every_stage_and_the_rejection_pass():
    seen = []
    a = CommonSampler(SamplingParams(temperature=0.0), VOCAB, grammar=RefuseA())
    b = CommonSampler(SamplingParams(temperature=0.0), VOCAB, grammar=RefuseA())
    token = a.sample(LOGITS, observe=lambda name, sampler, c: seen.append((name, sampler, len(c), c.selected)))
    assert token == b.sample(LOGITS) == 3  # "a" refused, resampled with the grammar first
    assert [n for n, *_ in seen] == ["logits", *CHAIN, "logits", "grammar", *CHAIN]
    assert seen[0][1] is None and seen[1][1] is a.chain.samplers[0] and seen[7][1] is a.grammar
    assert seen[0][2] == 8 and seen[5][3] >= 0  # the selector selected in the first pass too
    assert np.array_equal(a.candidates.ids, b.candidates.ids) and list(a.prev) == list(b.prev) == [3]


def test_observer_with_grammar_first_sees_one_pass():
    names = []
    s = CommonSampler(SamplingParams(temperature=0.0), VOCAB, grammar=RefuseA())
    assert s.sample(LOGITS, grammar_first=True, observe=lambda name, sampler, c: names.append(name)) == 3
    assert names == ["logits", "grammar", *CHAIN]
