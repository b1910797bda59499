"""The grammar sampler in chains and CommonSampler (llama.cpp's grammar sampler and common_sampler_sample): masks,
refusal, lazy triggers."""

import numpy as np
import pytest

from samplechain import Candidates, Chain, CommonSampler, Dist, Greedy, SamplingParams, TopK
from samplechain.grammar import Grammar, GrammarError, GrammarSampler

AB = 'root ::= "ab" "c"?'


def logits_favouring(vocab, *tokens):
    x = np.zeros(vocab.n_tokens, dtype=np.float32)
    for rank, t in enumerate(tokens):
        x[t] = 10.0 - rank
    return x


def test_apply_masks_full_and_small_candidate_sets(toy_vocab):
    s = GrammarSampler(toy_vocab, AB)
    c = Candidates.from_logits(np.zeros(toy_vocab.n_tokens, dtype=np.float32))
    s.apply(c)
    allowed = np.flatnonzero(np.isfinite(c.logits)).tolist()
    assert allowed == [9, 12, 13, 48]  # "a", "ab", "abc", and "a\0b" which llama.cpp reads as "a" (C string)
    few = Candidates(np.array([13, 3, 12], dtype=np.int32), np.zeros(3, dtype=np.float32))
    s.apply(few)
    assert np.isfinite(few.logits).tolist() == [True, False, True]
    assert s.mask()[[9, 12, 13]].all() and s.mask().sum() == 4
    assert s.mask_tensor().dtype.is_floating_point is False


def test_accept_follows_and_refuses(toy_vocab):
    s = GrammarSampler(toy_vocab, AB)
    with pytest.raises(GrammarError, match="refuses token 3"):
        s.accept(3)
    with pytest.raises(GrammarError, match="end-of-generation"):
        s.accept(1)  # llama.cpp aborts the process here
    s.accept(12)
    assert s.is_accepting()
    s.accept(1)  # EOG once complete: no state change
    assert s.mask()[[1, 11]].all() and s.mask().sum() == 2
    clone = s.clone()
    clone.accept(11)
    assert clone.mask().tolist() == [t == 1 for t in range(toy_vocab.n_tokens)]
    assert s.mask()[11]  # the original did not move
    s.reset()
    assert s.mask()[[9, 12, 13]].all() and not s.is_accepting()


def test_empty_grammar_constrains_nothing(toy_vocab):
    s = GrammarSampler(toy_vocab, "  ")
    assert s.disabled and s.mask() is None
    c = Candidates.from_logits(np.zeros(toy_vocab.n_tokens, dtype=np.float32))
    s.apply(c)
    s.accept(3)
    assert np.isfinite(c.logits).all()


def test_bad_inputs(toy_vocab):
    with pytest.raises(ValueError, match="Vocab"):
        GrammarSampler(None, AB)
    s = GrammarSampler(toy_vocab, AB)
    with pytest.raises(ValueError, match="entries"):
        s.apply(Candidates.from_logits(np.zeros(3, dtype=np.float32)))
    with pytest.raises(ValueError, match="outside"):
        s.apply(Candidates(np.array([999], dtype=np.int32), np.zeros(1, dtype=np.float32)))
    with pytest.raises(GrammarError, match="trigger token"):
        GrammarSampler.lazy(toy_vocab, AB, trigger_tokens=[10_000])
    with pytest.raises(GrammarError, match="invalid trigger pattern"):
        GrammarSampler.lazy(toy_vocab, AB, trigger_patterns=["(unclosed"])


def test_grammar_in_a_chain_constrains_greedy(toy_vocab):
    chain = Chain([GrammarSampler(toy_vocab, 'root ::= "hello" " world"'), TopK(5), Greedy()])
    x = logits_favouring(toy_vocab, 3, 9, 43)
    assert chain.sample(x) == 43  # "}" and "a" are refused
    assert chain.sample(logits_favouring(toy_vocab, 1, 44)) == 44
    assert chain.sample(logits_favouring(toy_vocab, 3, 1)) == 1  # complete: only EOG remains


def test_lazy_trigger_pattern_replays_from_the_capture_group(toy_vocab):
    g = "root ::= <tool> [a-c]+ </tool>"  # <tool> is a control token: token items, not literals, match it
    s = GrammarSampler.lazy(toy_vocab, g, trigger_patterns=[r"[\s\S]*?(<tool>)[\s\S]*"])
    c = Candidates.from_logits(np.zeros(toy_vocab.n_tokens, dtype=np.float32))
    s.apply(c)
    assert np.isfinite(c.logits).all()  # awaiting: nothing masked, EOG allowed
    for t in (43, 44, 7):  # "hello", " world", " " : no trigger yet
        s.accept(t)
        assert s.awaiting_trigger
    s.accept(45)  # "<tool>" arrives: the pattern sees its text, the grammar gets token 45 only
    assert not s.awaiting_trigger
    assert s.mask()[[9, 10, 11, 12, 13]].all() and not s.mask()[46]
    s.accept(12)
    assert s.mask()[46]


def test_lazy_trigger_inside_a_token_feeds_only_the_suffix(toy_vocab):
    g = 'root ::= "b" "c"'
    s = GrammarSampler.lazy(toy_vocab, g, trigger_patterns=["a(b)"])
    s.accept(12)  # "ab": match starts at the group, so the grammar is fed "b" (with the token's id)
    assert not s.awaiting_trigger
    assert s.mask()[11] and not s.mask()[12]


def test_lazy_trigger_token_and_full_pattern(toy_vocab):
    s = GrammarSampler.lazy(toy_vocab, 'root ::= <tool> "a"', trigger_tokens=[45])
    s.accept(9)
    assert s.awaiting_trigger
    s.accept(45)
    assert not s.awaiting_trigger and s.mask()[9]
    with pytest.raises(GrammarError):  # the grammar must accept the trigger token itself
        GrammarSampler.lazy(toy_vocab, 'root ::= "a"', trigger_tokens=[45]).accept(45)
    s = GrammarSampler.lazy(toy_vocab, 'root ::= "abc"', trigger_patterns=["^abc$"])
    s.accept(12)
    assert s.awaiting_trigger  # "ab" is not the whole pattern ...
    s.accept(11)
    assert not s.awaiting_trigger and s.is_accepting()  # ... "abc" is, fed from the start
    s.reset()
    assert s.awaiting_trigger


# --- CommonSampler ---------------------------------------------------------------------------------------------


def test_common_sampler_grammar_first_and_rejection_give_grammatical_tokens(toy_vocab):
    rng = np.random.default_rng(0)
    for grammar_first in (False, True):
        cs = CommonSampler(SamplingParams(seed=7, grammar='root ::= "a" [bc]+ "."?'), toy_vocab)
        out = []
        for _ in range(6):
            t = cs.sample(rng.normal(size=toy_vocab.n_tokens).astype(np.float32) * 3, grammar_first=grammar_first)
            out.append(t)
            if toy_vocab.is_eog(t):
                break
        m = Grammar.from_gbnf('root ::= "a" [bc]+ "."?').matcher()
        for t in out:
            if not toy_vocab.is_eog(t):
                assert m.accept_token(t, toy_vocab.token_bytes(t))


def test_rejection_keeps_the_chains_choice_when_allowed(toy_vocab):
    x = logits_favouring(toy_vocab, 9, 3)
    plain = CommonSampler(SamplingParams(seed=3), toy_vocab).sample(x)
    constrained = CommonSampler(SamplingParams(seed=3, grammar='root ::= [a-c]+'), toy_vocab)
    assert constrained.sample(x) == plain == 9
    assert constrained.grammar.state is not constrained.grammar.grammar.initial
    # refused first choice: resample with the mask (the dist RNG advances twice, as llama.cpp)
    cs = CommonSampler(SamplingParams(seed=3, top_k=1, grammar='root ::= "}"'), toy_vocab)
    assert cs.sample(x) == 3


def test_prompt_tokens_never_reach_the_grammar(toy_vocab):
    cs = CommonSampler(SamplingParams(grammar=AB), toy_vocab)
    cs.accept(3, is_generated=False)
    assert cs.grammar.state is cs.grammar.grammar.initial


def test_params_build_json_schema_and_lazy_grammars(toy_vocab):
    cs = CommonSampler(SamplingParams(json_schema={"type": "boolean"}), toy_vocab)
    assert cs.grammar.mask()[[18, 19]].all() and cs.grammar.mask().sum() == 2
    p = SamplingParams(grammar='root ::= <tool> "a"', grammar_lazy=True,
                       grammar_triggers=[{"type": 1, "value": "<tool>"}], preserved_tokens=["<tool>"])
    cs = CommonSampler(p, toy_vocab)
    assert cs.grammar.is_lazy and 45 in cs.grammar.trigger_tokens
    with pytest.raises(ValueError, match="preserved"):
        CommonSampler(SamplingParams(grammar=AB, grammar_lazy=True, grammar_triggers=[(1, "<tool>")]), toy_vocab)
    cs = CommonSampler(SamplingParams(grammar=AB, grammar_lazy=True, grammar_triggers=[(3, "a.*")]), toy_vocab)
    assert cs.grammar.trigger_patterns[0].source == "^a.*$"
    with pytest.raises(ValueError, match="needs the vocabulary"):
        CommonSampler(SamplingParams(grammar=AB))


def test_params_fields_round_trip_and_validate():
    p = SamplingParams.from_dict({"grammar": AB, "json_schema": {"type": "integer"}, "grammar_lazy": True,
                                  "grammar_triggers": [{"type": 0, "value": "<t>", "token": 5}],
                                  "preserved_tokens": ["<t>"]})
    assert p.grammar_triggers == ((0, "<t>", 5),)
    assert SamplingParams.from_dict(p.to_dict()) == p
    for bad in ({"grammar": 3}, {"json_schema": [1]}, {"grammar_lazy": "yes"},
                {"grammar_triggers": [{"type": 9, "value": "x"}]}, {"grammar_triggers": [{"type": 0, "value": "x"}]},
                {"preserved_tokens": "x"}):
        with pytest.raises(ValueError):
            SamplingParams.from_dict(bad)


def test_chain_with_dist_is_reproducible_under_a_grammar(toy_vocab):
    def run():
        chain = Chain([GrammarSampler(toy_vocab, 'root ::= [a-c]{4}'), Dist(seed=11)])
        rng = np.random.default_rng(5)
        return [chain.sample(rng.normal(size=toy_vocab.n_tokens).astype(np.float32)) for _ in range(3)]

    assert run() == run()
