"""Speculative decoding in the generation loop: the same text with and without drafting (greedy and seeded, with
penalties, DRY and grammars), rejected drafts rolled back, the adaptive length, distribution-preserving speculative
sampling (chi-squared), and the draft model."""

import numpy as np
import pytest
from scipy import stats as scipy_stats

from samplechain import SamplingParams
from samplechain.params import CommonSampler
from samplechain.runtime.speculation import LinearCost, Speculation, speculative_sample, target_distribution
from samplechain.speculative.draft_model import DraftModel, check_compatible

PARA = ("The ocean covers seventy percent of the planet. Its currents move heat from the equator to the poles, and "
        "its depths store carbon for centuries. Without it, the weather of every continent would be different.")
CODE = ("def mean(values):\n    total = 0\n    for v in values:\n        total += v\n"
        "    return total / len(vaules)\n\n\n"
        "def variance(values):\n    m = mean(values)\n    return sum((v - m) ** 2 for v in values) / len(values)\n")
TASKS = {
    "copy": f"Text: {PARA}\n\nThe same text, copied exactly:\n\nText: The ocean",
    "code": f"# buggy version\n{CODE}\n\n# fixed version (only `vaules` changed to `values`)\ndef mean(values):\n",
    "quotes": f"Summarize this text, quoting its key sentences:\n\n{PARA}\n\nSummary:",
    "story": "Once upon a time, in a lighthouse at the edge of the world,",
}


class Lookup:
    """A minimal prompt-lookup drafter: the tokens after the latest earlier occurrence of the last three."""

    name = "lookup"
    n_max = 16

    def __init__(self):
        self.accepted = []

    def begin(self, prompt):
        pass

    def draft(self, history, id_last):
        key = [*history[-2:], id_last]
        for j in range(len(history) - 3, 0, -1):
            if history[j:j + 3] == key:
                return list(history[j + 3:j + 3 + self.n_max])
        return []

    def accept(self, n_accepted, is_other=False):
        self.accepted.append((n_accepted, is_other))


class Wrong:
    """Always drafts tokens the target will not produce."""

    name = "wrong"
    n_max = 8

    def begin(self, prompt):
        pass

    def draft(self, history, id_last):
        return [7] * 8

    def accept(self, n_accepted, is_other=False):
        pass


def _both(model, prompt, params, n=64, drafter=None, **kw):
    plain = "".join(model.generate(prompt, params, n_predict=n, **kw))
    spec = Speculation([drafter or Lookup()])
    fast = "".join(model.generate(prompt, params, n_predict=n, speculation=spec, **kw))
    return plain, fast, spec


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("params", [
    dict(temperature=0.0),
    dict(seed=11),
    dict(seed=5, repeat_penalty=1.3, repeat_last_n=32, frequency_penalty=0.2, dry_multiplier=0.8),
])
def test_same_text_with_and_without_drafting(smol, task, params):
    plain, fast, spec = _both(smol, TASKS[task], SamplingParams(**params))
    assert fast == plain
    if task == "copy" and "repeat_penalty" not in params:  # (penalties push the model away from copying)
        assert spec.stats["lookup"].accepted > 10  # the copy task really was drafted


def test_same_text_with_a_grammar(smol):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array",
              "items": {"type": "string"}, "maxItems": 3}}, "required": ["name", "tags"]}
    plain, fast, _ = _both(smol, 'A JSON object {"name": "sea", "tags": ["a", "b"]} and another one:',
                           SamplingParams(seed=3, json_schema=schema), n=48)
    assert fast == plain and fast.startswith("{")


def test_rejected_drafts_leave_no_cells(smol):
    ctx = smol.new_context(512)
    spec = Speculation([Wrong()], adaptive=False)
    text = "".join(smol.generate(TASKS["story"], SamplingParams(seed=2), n_predict=30, context=ctx,
                                 speculation=spec))
    assert text == "".join(smol.generate(TASKS["story"], SamplingParams(seed=2), n_predict=30))
    n_cells = int((ctx.kv.pos >= 0).sum())
    assert n_cells == ctx.seq_pos_max(0) + 1  # one cell per committed position, none left by rejected drafts
    assert spec.stats["wrong"].accepted == 0 and spec.stats["wrong"].drafted > 0


def test_adaptive_length_stops_drafting_what_is_never_accepted(smol):
    # a fixed cost model (each token past the first costs a quarter step) instead of this machine's timings, which
    # made the test flaky; the exact lengths are in test_policy.py
    spec = Speculation([Wrong()], probe_every=16, cost=LinearCost(0.25))
    "".join(smol.generate(TASKS["story"], SamplingParams(seed=2), n_predict=64, speculation=spec))
    s = spec.stats["wrong"]
    assert s.accepted == 0 and s.drafts <= 12 and s.drafted <= 24  # probes only, after the first rejections


def test_drafting_stops_at_n_predict_and_eog(smol):
    for n in (1, 2, 7, 33):
        plain, fast, _ = _both(smol, TASKS["copy"], SamplingParams(temperature=0.0), n=n)
        assert fast == plain
    plain, fast, _ = _both(smol, "What is the capital of France?", SamplingParams(temperature=0.0), n=200,
                           chat=True)
    assert fast == plain == "The capital of France is Paris."


def test_speculation_parameters_are_checked():
    with pytest.raises(ValueError, match="draft-min 5 exceeds draft-max 2"):
        Speculation([], n_max=2, n_min=5)
    with pytest.raises(ValueError, match="must be >= 0"):
        Speculation([], n_max=-1)
    with pytest.raises(ValueError, match="verify"):
        Speculation([], verify="guess")


def test_best_length_follows_cost_and_acceptance():
    spec = Speculation([])
    spec.record_time(1, 0.010)
    spec.record_time(5, 0.015)  # 5 tokens cost 1.5 single steps: each one past the first 1/8 of a step
    assert spec.cost.slope == 0.125
    assert spec.best_length(0.99, 16) == 16
    assert spec.best_length(0.05, 16) == 0
    assert spec.best_length(0.6, 16) == 3


# --- distribution-preserving speculative sampling ---------------------------------------------------------------

def _toy(seed):
    rng = np.random.default_rng(seed)
    return rng.normal(0, 1.5, 12).astype(np.float32)


@pytest.mark.slow  # 20,000 draws
def test_speculative_sampling_reproduces_the_target_distribution():
    """The first emitted token is distributed as the target's chain says, whatever the draft's distribution."""
    target_logits, n = _toy(1), 20000
    params = SamplingParams(seed=1, top_k=0, top_p=1.0, min_p=0.0, temperature=0.9)
    sampler = CommonSampler(params, n_vocab=12)
    ids, p = target_distribution(sampler, target_logits)
    q = np.exp(_toy(2).astype(np.float64))
    q /= q.sum()
    rng = np.random.default_rng(7)
    counts = np.zeros(12)
    for _ in range(n):
        x = int(rng.choice(12, p=q))
        s = sampler.clone()
        first = speculative_sample(s, [target_logits, target_logits], [x], [(np.arange(12), q)], rng)[0]
        counts[first] += 1
    expected = np.zeros(12)
    expected[ids] = p * n
    chi2, pvalue = scipy_stats.chisquare(counts, expected)
    assert pvalue > 1e-3, (chi2, counts, expected)
    # the draft's own distribution is visibly different: the same test against q fails
    assert scipy_stats.chisquare(counts, q * n)[1] < 1e-6


@pytest.mark.slow  # 12,000 draws
def test_speculative_sampling_with_truncated_candidate_sets():
    """Target top-k 3, draft over other ids: the residual is taken over the union of ids (llama.cpp subtracts
    index-wise)."""
    logits = np.array([3.0, 2.5, 2.0, 1.0, 0.5, 0.0], dtype=np.float32)
    sampler = CommonSampler(SamplingParams(seed=1, top_k=3, top_p=1.0, min_p=0.0, temperature=1.0), n_vocab=6)
    ids, p = target_distribution(sampler, logits)
    assert ids.tolist() == [0, 1, 2]
    q_ids, q = np.array([2, 3, 4]), np.array([0.2, 0.5, 0.3])
    rng = np.random.default_rng(3)
    counts = np.zeros(6)
    for _ in range(12000):
        x = int(rng.choice(q_ids, p=q))
        counts[speculative_sample(sampler.clone(), [logits, logits], [x], [(q_ids, q)], rng)[0]] += 1
    assert counts[3:].sum() == 0  # never a token the target's top-k removed
    assert scipy_stats.chisquare(counts[:3], p * 12000)[1] > 1e-3


def test_greedy_target_accepts_only_its_argmax():
    logits = np.array([0.0, 4.0, 1.0], dtype=np.float32)
    sampler = CommonSampler(SamplingParams(temperature=0.0), n_vocab=3)
    rng = np.random.default_rng(0)
    for x in range(3):
        out = speculative_sample(sampler.clone(), [logits, logits], [x], [(np.arange(3), np.full(3, 1 / 3))], rng)
        assert out == ([1, 1] if x == 1 else [1])


# --- the draft model --------------------------------------------------------------------------------------------

@pytest.mark.slow  # the dequantized SmolLM2 decodes a few tokens a second
def test_int4_draft_for_the_dequantized_target(smol, dense_of):
    """The compiled int4 path drafts for the dequantized reference model: same text, most drafts accepted."""
    from samplechain.runtime.generation import Model

    dense = Model(smol.path, smol.gguf, dense_of(smol), smol.vocab, 0.0)
    drafter = DraftModel(smol, dense.vocab, n_max=6, n_ctx=512)
    plain, fast, spec = _both(dense, TASKS["copy"], SamplingParams(temperature=0.0), n=40, drafter=drafter,
                              n_ctx=512)
    assert fast == plain
    s = spec.stats["draft-simple"]
    assert s.drafted > 0 and s.accepted / s.drafted > 0.7


def test_draft_sampling_keeps_the_target_distribution_per_token(smol):
    """Verify = "sample" with a sampling draft model runs and accepts drafts (its exact distribution is tested on
    toy logits above)."""
    drafter = DraftModel(smol, smol.vocab, n_max=4, n_ctx=512, sample=True, seed=1)
    spec = Speculation([drafter], verify="sample", adaptive=False, seed=1)
    text = "".join(smol.generate(TASKS["copy"], SamplingParams(seed=4), n_predict=32, speculation=spec))
    assert len(smol.tokenize(text)) >= 16 and spec.stats["draft-simple"].accepted > 0


def test_incompatible_draft_vocabularies_are_refused(smol, gemma):
    with pytest.raises(ValueError, match="vocabulary"):
        check_compatible(smol.vocab, gemma.vocab)
    with pytest.raises(ValueError, match="p_min"):
        DraftModel(smol, smol.vocab, p_min=2.0)
