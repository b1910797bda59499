"""SamplingParams and CommonSampler (llama.cpp's common/sampling.cpp and its flags in common/arg.cpp)."""

import math

import numpy as np
import pytest

from samplechain import DEFAULT_SEED, CommonSampler, Sampler, SamplingParams, Vocab
from samplechain.params import DEFAULT_SAMPLERS, parse_sampler_chars, parse_sampler_names

LOGITS = np.log(np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32))


def test_defaults_match_llama_cpp():
    p = SamplingParams()
    assert (p.seed, p.top_k, p.top_p, p.min_p, p.temperature, p.typical_p) == (DEFAULT_SEED, 40, 0.95, 0.05, 0.8, 1.0)
    assert (p.repeat_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty) == (64, 1.0, 0.0, 0.0)
    assert (p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n) == (0.0, 1.75, 2, 64)
    assert p.dry_sequence_breakers == ("\n", ":", '"', "*")
    assert (p.xtc_probability, p.xtc_threshold, p.top_n_sigma, p.mirostat, p.mirostat_tau, p.mirostat_eta) == (
        0.0, 0.1, -1.0, 0, 5.0, 0.1)
    assert (p.adaptive_target, p.adaptive_decay, p.min_keep, p.n_probs, p.n_prev) == (-1.0, 0.9, 0, 0, 64)
    assert p.samplers == DEFAULT_SAMPLERS and p.sampler_chars == "edskypmxt"


def test_default_chain_drops_disabled_samplers():
    assert CommonSampler().describe() == "logits -> top-k -> top-p -> min-p -> temp-ext -> dist"


def test_full_default_chain_when_everything_is_enabled():
    v = Vocab([bytes([i]) for i in range(256)])
    p = SamplingParams(repeat_penalty=1.1, dry_multiplier=0.8, top_n_sigma=2.0, typical_p=0.9, xtc_probability=0.5,
                       logit_bias={5: 1.0})
    assert CommonSampler(p, v).describe() == (
        "logits -> logit-bias -> penalties -> dry -> top-n-sigma -> top-k -> typical -> top-p -> min-p -> xtc"
        " -> temp-ext -> dist")


@pytest.mark.parametrize("samplers, described", [
    ("top_k;temperature", "logits -> top-k -> temp-ext -> dist"),
    (["min-p", "TOP-K", "temp"], "logits -> min-p -> top-k -> temp-ext -> dist"),
    ("", "logits -> dist"),
    ("top_k;adaptive_p", "logits -> top-k -> adaptive-p"),
])
def test_sampler_order(samplers, described):
    assert CommonSampler(SamplingParams(samplers=samplers)).describe() == described


def test_mirostat_replaces_the_chain():
    p = SamplingParams(mirostat=2, repeat_penalty=1.2, logit_bias=[[3, -1.0]])
    assert CommonSampler(p).describe() == "logits -> logit-bias -> temp -> mirostat-v2"
    assert CommonSampler(SamplingParams(mirostat=1), n_vocab=4).describe() == "logits -> temp -> mirostat"
    with pytest.raises(ValueError, match="vocabulary size"):
        CommonSampler(SamplingParams(mirostat=1))


def test_sampler_names_and_chars():
    assert parse_sampler_names("top_k;nucleus;typ;temp") == ("top_k", "top_p", "typ_p", "temperature")
    assert parse_sampler_chars("kpmt") == ("top_k", "top_p", "min_p", "temperature")
    for bad in ("typical", "greedy", "dist", "mirostat", "top k"):
        with pytest.raises(ValueError, match="unknown sampler name"):
            parse_sampler_names(bad)
    with pytest.raises(ValueError, match="unknown sampler code"):
        parse_sampler_chars("kz")


def test_temperature_zero_is_greedy_over_processed_logits():
    s = CommonSampler(SamplingParams(temperature=0.0, seed=1))
    assert [s.sample(LOGITS) for _ in range(5)] == [3] * 5
    assert s.top_probs(4) == [(3, 1.0)]


def test_same_seed_same_tokens_and_reset():
    rows = [np.random.default_rng(i).normal(0, 2, 500).astype(np.float32) for i in range(10)]
    a = CommonSampler(SamplingParams(seed=42, repeat_penalty=1.3, xtc_probability=0.5, xtc_threshold=0.05))
    b = CommonSampler(SamplingParams(seed=42, repeat_penalty=1.3, xtc_probability=0.5, xtc_threshold=0.05))
    first = [a.sample(r) for r in rows]
    assert first == [b.sample(r) for r in rows]
    a.reset()
    assert [a.sample(r) for r in rows] == first
    assert a.seed == 42


def test_top_probs_after_default_chain():
    s = CommonSampler(SamplingParams(seed=0))
    s.sample(LOGITS)
    probs = s.top_probs(3)
    assert [t for t, _ in probs] == [3, 2, 1]
    assert math.isclose(sum(p for _, p in s.top_probs(10)), 1.0, rel_tol=1e-6)


def test_ignore_eos_bans_eog():
    v = Vocab([b"a", b"b", b"</s>"], eos=2)
    s = CommonSampler(SamplingParams(ignore_eos=True, temperature=0.0), v)
    assert s.sample(np.array([0.0, 1.0, 9.0], dtype=np.float32)) == 1


def test_logit_bias_text_and_range():
    v = Vocab([b"a", b"b", b"ab"])
    s = CommonSampler(SamplingParams(logit_bias={"ab": -math.inf}, temperature=0.0), v)
    assert s.sample(np.array([0.0, 1.0, 9.0], dtype=np.float32)) == 1
    with pytest.raises(ValueError, match="outside the vocabulary"):
        CommonSampler(SamplingParams(logit_bias=[[3, 1.0]]), v)
    with pytest.raises(ValueError, match="needs a vocabulary"):
        CommonSampler(SamplingParams(logit_bias={"ab": 1.0}))


def test_accept_feeds_penalties_history():
    s = CommonSampler(SamplingParams(repeat_penalty=100.0, temperature=0.0, samplers="penalties;temperature"))
    s.accept(3)
    assert s.sample(LOGITS) == 2
    assert list(s.prev) == [3, 2] and s.last() == 2


class BanOdd(Sampler):
    """A stand-in grammar: refuses odd tokens, records accepted tokens."""

    name = "grammar"

    def __init__(self):
        self.accepted = []

    def apply(self, c):
        c.set_logits(np.where(c.ids % 2 == 1, np.float32(-np.inf), c.logits))

    def accept(self, token):
        self.accepted.append(token)


@pytest.mark.parametrize("grammar_first", [False, True])
def test_grammar_seam_both_strategies(grammar_first):
    g = BanOdd()
    s = CommonSampler(SamplingParams(seed=3, temperature=0.0), grammar=g)
    s.accept(1)  # prompt token: not fed to the grammar
    assert s.sample(LOGITS, grammar_first=grammar_first) == 2
    assert g.accepted == [2]


def test_rejection_path_consumes_two_draws():
    # the first pass selects 3 (refused), the resample draws again: same tokens as llama.cpp's rejection
    s = CommonSampler(SamplingParams(seed=0, samplers=""), grammar=BanOdd())
    ref = CommonSampler(SamplingParams(seed=0, samplers=""))
    tokens = [s.sample(LOGITS) for _ in range(5)]
    assert all(t % 2 == 0 for t in tokens)
    assert ref.chain[0].rng.uniform_double() != s.chain[0].rng.uniform_double()


def test_sample_and_accept_n():
    s = CommonSampler(SamplingParams(temperature=0.0))
    rows = [LOGITS, LOGITS[::-1].copy(), LOGITS]
    assert s.sample_and_accept_n(rows, [3, 0]) == [3, 0, 3]
    assert s.sample_and_accept_n(rows, [3, 1]) == [3, 0]
    with pytest.raises(ValueError, match="logits rows"):
        s.sample_and_accept_n(rows, [3])


def test_clone_continues_identically():
    s = CommonSampler(SamplingParams(seed=5, repeat_penalty=1.5))
    s.sample(LOGITS)
    t = s.clone()
    assert [s.sample(LOGITS) for _ in range(5)] == [t.sample(LOGITS) for _ in range(5)]


# --- from_dict / to_dict -------------------------------------------------------------------------------

def test_from_dict_server_names_and_clamps():
    p = SamplingParams.from_dict({
        "temperature": -1, "top_k": -5, "top_p": 1.5, "min_p": -0.1, "mirostat": 7, "seed": -1,
        "samplers": "kt", "logit_bias": {"15": False, "2": 0.5}, "dry_base": 0.5, "n_probs": -3,
        "typical_p": None, "adaptive_target": 3.0, "penalty_repeat": 1.1,
    })
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.mirostat, p.seed) == (0.0, 0, 1.0, 0.0, 2, DEFAULT_SEED)
    assert p.samplers == ("top_k", "temperature") and p.dry_base == 1.75 and p.n_probs == 0
    assert p.logit_bias == ((15, -math.inf), (2, 0.5)) and p.adaptive_target == 1.0 and p.repeat_penalty == 1.1
    assert SamplingParams.from_dict({"samplers": ["top_k", "min_p"]}).samplers == ("top_k", "min_p")


def test_round_trip():
    p = SamplingParams(seed=3, top_k=10, logit_bias=[[1, -math.inf]], samplers="top_k;min_p")
    assert SamplingParams.from_dict(p.to_dict()) == p


@pytest.mark.parametrize("body, field", [
    ({"temprature": 0.5}, "temprature"),
    ({"top_k": "many"}, "top_k"),
    ({"top_k": 1.5}, "top_k"),
    ({"repeat_last_n": -1}, "repeat_last_n"),
    ({"dry_allowed_length": -1}, "dry_allowed_length"),
    ({"adaptive_decay": 1.5}, "adaptive_decay"),
    ({"dry_sequence_breakers": []}, "dry_sequence_breakers"),
    ({"samplers": ["top_k", "greedy"]}, "samplers"),
    ({"samplers": "kq"}, "samplers"),
    ({"logit_bias": [[1]]}, "logit_bias"),
    ({"logit_bias": 5}, "logit_bias"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"min_keep": -1}, "min_keep"),
    ({"seed": 2**32}, "seed"),
    ({"repeat_penalty": 0.0}, "repeat_penalty"),
    ({"temperature": float("nan")}, "temperature"),
    ({"frequency_penalty": float("inf")}, "frequency_penalty"),
])
def test_from_dict_rejects_with_the_field_name(body, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams.from_dict(body)


def test_from_dict_rejects_non_objects():
    with pytest.raises(ValueError, match="JSON object"):
        SamplingParams.from_dict([1, 2])


@pytest.mark.parametrize("kwargs, match", [
    ({"top_p": float("nan")}, "top_p"), ({"temperature": float("inf")}, "temperature"),
    ({"repeat_penalty": -1.0}, "repeat_penalty"), ({"repeat_penalty": 1e-320}, "repeat_penalty"),
    ({"repeat_last_n": -1}, "repeat_last_n"), ({"dry_penalty_last_n": -2}, "dry_penalty_last_n"),
    ({"mirostat": 3}, "mirostat"), ({"top_k": 2.5}, "top_k"), ({"samplers": "top_k;foo"}, "foo"),
    ({"logit_bias": {1: float("inf")}}, r"\+inf"), ({"logit_bias": [[-1, 1.0]]}, ">= 0"),
    ({"seed": -7}, "seed"), ({"ignore_eos": "yes"}, "ignore_eos"), ({"dry_sequence_breakers": [1]}, "strings"),
])
def test_constructor_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)
