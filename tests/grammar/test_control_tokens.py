"""Control and end-of-generation tokens under a grammar, on SmolLM2's and Gemma 3's real vocabularies.

Control tokens (special, not end-of-generation) are matched only by token items (``<[id]>``, ``<|name|>``,
``!<[id]>``), never by literals, character classes or ``.``. llama.cpp matches their rendered text, so 14 of
SmolLM2's 17 control tokens (``<|im_start|>``, ``<file_sep>``, ...) fit inside a JSON string there
(a bug not to copy). End-of-generation (EOG) tokens are allowed exactly where the grammar can end, as in
llama.cpp's llama_grammar_apply_impl. ``mask()``, ``mask_tensor()``, ``allows()``, ``apply()`` and ``accept`` agree,
for lazy grammars too.
"""

import numpy as np
import pytest
from tests.grammar.conftest import packaged_vocab

from samplechain import Candidates
from samplechain.grammar import GrammarError, GrammarSampler, MaskEngine, TokenTable, json_schema_to_gbnf

# per vocabulary: size, special (control and unknown) and EOG sets as llama.cpp builds them (<repo_name> and Gemma's
# FIM separator end generation), a turn-start control token, an EOG turn end,
# another control token, and the ordinary tokens that spell the opening quote of a JSON string
MODELS = {
    "smollm2": {"n": 49152, "n_special": 17, "eog": [0, 2, 4], "n_control": 14, "start": ("<|im_start|>", 1),
                "end": ("<|im_end|>", 2), "other": ("<file_sep>", 5), "quote": 18},
    "gemma3-270m": {"n": 262144, "n_special": 6250, "eog": [1, 106, 212], "n_control": 6247,
                    "start": ("<start_of_turn>", 105), "end": ("<end_of_turn>", 106), "other": ("<mask>", 4),
                    "quote": 236775},
}
STRING = json_schema_to_gbnf({"type": "string"})


def load(name):
    """A packaged model's vocabulary, straight from its GGUF (once per session)."""
    return packaged_vocab(name)


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    """(vocabulary, expectations) of one packaged model."""
    return load(request.param), MODELS[request.param]


def control_ids(vocab):
    return np.array(sorted(vocab.control), dtype=np.int64)


def allowed(sampler):
    return np.flatnonzero(sampler.mask()).tolist()


def agreement(sampler, tokens):
    """What mask(), mask_tensor(), allows() (uncached: one transition per token), apply() on small and full
    candidate sets, and accept (on a clone) say about ``tokens``; asserts they all agree and returns it."""
    tokens = np.asarray(tokens, dtype=np.int64)
    fresh = sampler.clone()
    fresh.engine = MaskEngine(sampler.grammar, sampler.engine.table)  # no cached mask: allows() transitions
    by_allows = np.array([fresh.allows(t) for t in tokens.tolist()], dtype=bool)
    mask = sampler.mask()
    by_mask = np.ones(len(tokens), dtype=bool) if mask is None else mask[tokens]
    tensor = sampler.mask_tensor()
    by_tensor = by_mask if tensor is None else tensor.numpy()[tokens]
    full = Candidates.from_logits(np.zeros(sampler.vocab.n_tokens, dtype=np.float32))
    sampler.apply(full)
    by_apply = np.isfinite(full.logits[tokens])
    by_small = np.zeros(len(tokens), dtype=bool)
    for lo in range(0, len(tokens), 32):  # up to 32 candidates: checked one by one
        few = Candidates(tokens[lo : lo + 32].astype(np.int32), np.zeros(len(tokens[lo : lo + 32]), np.float32))
        sampler.apply(few)
        by_small[lo : lo + 32] = np.isfinite(few.logits)
    by_accept = np.zeros(len(tokens), dtype=bool)
    for i, t in enumerate(tokens.tolist()):
        try:
            sampler.clone().accept(t)
            by_accept[i] = True
        except GrammarError:
            pass
    for name, got in [("mask_tensor", by_tensor), ("allows", by_allows), ("apply", by_apply),
                      ("apply (small set)", by_small), ("accept", by_accept)]:
        assert (got == by_mask).all(), (name, tokens[got != by_mask][:10].tolist())
    return by_mask


def test_control_and_eog_sets_of_the_packaged_vocabularies(model):
    vocab, want = model
    assert vocab.n_tokens == want["n"]
    assert len(vocab.special) == want["n_special"]
    assert sorted(vocab.eog) == want["eog"]
    assert vocab.control == vocab.special - vocab.eog and len(vocab.control) == want["n_control"]
    assert vocab.tokenize(want["start"][0], parse_special=True) == [want["start"][1]]
    assert want["start"][1] in vocab.control and want["other"][1] in vocab.control
    table = TokenTable.of(vocab)
    assert table.control.tolist() == sorted(vocab.control)
    assert all(table.pieces[t] == b"" for t in vocab.control)  # no text for the grammar to match
    assert not table.usable[control_ids(vocab)].any() and table.by_id[control_ids(vocab)].all()
    assert not table.by_id[want["eog"]].any()


def test_json_string_allows_no_control_token(model):
    vocab, want = model
    s = GrammarSampler(vocab, STRING)
    s.accept(want["quote"])  # inside the string now
    mask = s.mask()
    assert int(mask[control_ids(vocab)].sum()) == 0
    assert not mask[want["eog"]].any()
    # llama.cpp's reading (control tokens matched by their rendered text) lets every one of them in
    text_table = TokenTable([vocab.token_bytes(i) for i in range(vocab.n_tokens)], vocab.eog)
    engine = MaskEngine(s.grammar, text_table)
    assert int(engine.mask(s.state)[control_ids(vocab)].sum()) == want["n_control"]  # 14 / 6247
    assert int(engine.mask(s.state).sum()) - int(mask.sum()) == want["n_control"]  # and nothing else changed
    # the *text* of a control token is still fine inside a string, spelled with ordinary tokens
    for t in vocab.tokenize(want["start"][0]):
        s.accept(t)
    s.accept(want["quote"])
    assert s.is_accepting()


def test_smollm2_control_tokens_in_a_json_string_before_and_after():
    """The issue's numbers: of SmolLM2's 17 special tokens, a JSON string allowed 15 (llama.cpp: 14, its EOG set
    also holding ``<reponame>``); now it allows none (the two EOG tokens only where the grammar can end)."""
    vocab = load("smollm2")
    special = np.array(sorted(vocab.special))
    s = GrammarSampler(vocab, STRING)
    s.accept(18)
    assert int(s.mask()[special].sum()) == 0
    old = MaskEngine(s.grammar, TokenTable([vocab.token_bytes(i) for i in range(vocab.n_tokens)], vocab.eog))
    assert np.flatnonzero(old.mask(s.state)[special]).tolist() == [1, 3, *range(5, 17)]  # 14 of 17


def test_no_control_token_anywhere_in_a_json_document(model):
    vocab, want = model
    s = GrammarSampler(vocab, json_schema_to_gbnf({}))
    doc = '{"a": [1, "x <|im_start|> <start_of_turn>", null], "b": {"c": true, "d": -2.5e3}}'
    ctl = control_ids(vocab)
    for t in vocab.tokenize(doc):
        mask = s.mask()
        assert mask[t] and not mask[ctl].any() and not mask[want["eog"]].any()
        s.accept(t)
    assert s.is_accepting()
    assert not s.mask()[ctl].any() and s.mask()[want["eog"]].all()


def test_token_item_allows_exactly_that_token(model):
    vocab, want = model
    name, tok = want["start"]
    ctl = sorted(vocab.control)
    for text, t in [(f"root ::= <[{tok}]>", tok), (f"root ::= {name}", tok), (f"root ::= <[{ctl[0]}]>", ctl[0]),
                    (f"root ::= <[{ctl[-1]}]>", ctl[-1])]:
        s = GrammarSampler(vocab, text)
        assert allowed(s) == [t], text
        agreement(s, [*ctl, *want["eog"]])
        s.accept(t)
        assert s.is_accepting() and allowed(s) == want["eog"]  # complete: only end of generation


def test_token_item_beside_text_allows_that_control_token_only(model):
    vocab, want = model
    name, tok = want["start"]
    s = GrammarSampler(vocab, f'root ::= ( {name} | [^"] ) "x"')
    ctl = control_ids(vocab)
    mask = agreement(s, [*ctl, *want["eog"]])
    assert ctl[mask[: len(ctl)]].tolist() == [tok] and not mask[len(ctl) :].any()
    assert s.mask()[vocab.tokenize("<")[0]]  # text still goes through the character class


def test_literal_spelling_a_control_token_does_not_match_it(model):
    vocab, want = model
    name, tok = want["start"]
    s = GrammarSampler(vocab, f'root ::= "{name}"')
    assert not s.allows(tok) and not s.mask()[tok]
    with pytest.raises(GrammarError, match=f"refuses control token {tok}"):
        s.clone().accept(tok)
    for t in vocab.tokenize(name):  # the same text in ordinary tokens is what the literal takes
        s.accept(t)
    assert s.is_accepting()


def test_negated_token_item_accepts_any_other_token_control_ones_included(model):
    vocab, want = model
    name, tok = want["start"]
    other = want["other"][1]
    for text in (f"root ::= !<[{tok}]>", f"root ::= !{name}"):
        s = GrammarSampler(vocab, text)
        expect = np.ones(vocab.n_tokens, dtype=bool)
        expect[[tok, *want["eog"]]] = False  # !<[id]>: any single token but the id; EOG only at the end
        assert (s.mask() == expect).all()
        assert int(s.mask().sum()) == want["n"] - 1 - len(want["eog"])
        mask = agreement(s, [*control_ids(vocab), *want["eog"]])
        assert int(mask.sum()) == want["n_control"] - 1
        s.accept(other)  # a control token other than the id is one whole token for !<[id]>
        assert s.is_accepting() and allowed(s) == want["eog"]


def test_negated_token_item_sequence_around_control_tokens(model):
    vocab, want = model
    (start_name, start), (other_name, other) = want["start"], want["other"]
    # spec's token grammar shape: <open> (!<close>)* <close>, with control tokens for open and close
    s = GrammarSampler(vocab, f"root ::= {start_name} content {other_name}\ncontent ::= (!{other_name})*")
    assert allowed(s) == [start]
    s.accept(start)
    expect = np.ones(vocab.n_tokens, dtype=bool)
    expect[want["eog"]] = False
    assert (s.mask() == expect).all()  # everything but EOG: !<close> takes all others, <close> itself
    for t in [*vocab.tokenize("hello"), start, *vocab.tokenize("<x>")]:
        s.accept(t)
    assert not s.is_accepting()
    s.accept(other)
    assert s.is_accepting() and allowed(s) == want["eog"]


def test_end_of_generation_only_where_the_grammar_can_end(model):
    vocab, want = model
    eog = want["eog"]
    s = GrammarSampler(vocab, STRING)
    assert not s.mask()[eog].any() and not any(s.allows(t) for t in eog)
    with pytest.raises(GrammarError, match="end-of-generation"):
        s.clone().accept(eog[0])
    for t in vocab.tokenize('"x"'):
        s.accept(t)
    assert allowed(s) == eog  # complete string: nothing but end of generation
    assert all(s.allows(t) for t in eog)
    state = s.state
    s.accept(eog[-1])
    assert s.state is state  # EOG once complete: no state change
    # a grammar that may be empty allows EOG at once, beside its text
    s = GrammarSampler(vocab, "root ::= [a-z]*")
    assert s.mask()[eog].all() and s.mask()[vocab.tokenize("abc")[0]]
    # a token item naming an EOG token never allows it: EOG only where the grammar can end (as llama.cpp)
    s = GrammarSampler(vocab, f'root ::= "a" {want["end"][0]}')
    s.accept(vocab.tokenize("a")[0])
    assert not s.mask().any() and not s.allows(want["end"][1])
    agreement(s, [*control_ids(vocab), *eog])


# (grammar, text fed step by step, per state: the control tokens allowed and whether EOG is); START / OTHER
# name the model's turn-start and other control token; "all-OTHER": every control token but OTHER
AGREEMENT_CASES = [
    (STRING, ['"', "ab"], [("", False), ("", False), ("", False)]),
    ("root ::= .*", ["zz", "<"], [("", True), ("", True), ("", True)]),
    ('root ::= [^a]* "b"', ["zz", "b"], [("", False), ("", False), ("", True)]),
    ("root ::= <[OTHER]> | [a-z]+", ["zz"], [("OTHER", False), ("", True)]),
    ('root ::= !<[OTHER]> "x"?', ["z", "x"], [("all-OTHER", False), ("", True), ("", True)]),
    ("root ::= ( <[START]> | . )* <[OTHER]>", ["zz"], [("START OTHER", False), ("START OTHER", False)]),
]


@pytest.mark.parametrize(("text", "steps", "expect"), AGREEMENT_CASES, ids=range(len(AGREEMENT_CASES)))
def test_mask_allows_apply_and_accept_agree(model, text, steps, expect):
    vocab, want = model
    names = {"START": want["start"][1], "OTHER": want["other"][1]}
    s = GrammarSampler(vocab, text.replace("START", str(names["START"])).replace("OTHER", str(names["OTHER"])))
    ctl = control_ids(vocab)
    for i, (controls, eog) in enumerate(expect):
        if i:
            for t in vocab.tokenize(steps[i - 1]):
                s.accept(t)
        mask = agreement(s, [*ctl, *want["eog"]])
        if controls == "all-OTHER":
            want_ctl = set(vocab.control) - {names["OTHER"]}
        else:
            want_ctl = {names[k] for k in controls.split()}
        assert set(ctl[mask[: len(ctl)]].tolist()) == want_ctl, (text, i)
        assert mask[len(ctl) :].tolist() == [eog] * len(want["eog"]), (text, i)


def test_lazy_grammar_after_a_control_trigger_token(model):
    vocab, want = model
    name, tok = want["start"]
    s = GrammarSampler.lazy(vocab, f"root ::= {name} string\n{STRING.replace('root ::=', 'string ::=')}",
                            trigger_tokens=[tok])
    tokens = [*control_ids(vocab), *want["eog"]]
    assert s.mask() is None and agreement(s, tokens).all()  # awaiting: nothing is masked
    s.accept(want["other"][1])  # a control token while waiting: buffered, no trigger
    assert s.awaiting_trigger
    s.accept(tok)
    assert not s.awaiting_trigger and s.mask() is not None
    assert not agreement(s, tokens).any()  # the grammar's string comes next: a quote, not a control token
    assert s.mask()[want["quote"]] and not s.mask()[vocab.tokenize("a")[0]]
    s.accept(want["quote"])
    assert not agreement(s, tokens).any()  # inside the string: no control token, no EOG
    for t in vocab.tokenize('x"'):
        s.accept(t)
    assert s.is_accepting() and allowed(s) == want["eog"]


def test_lazy_grammar_after_a_pattern_over_control_text(model):
    vocab, want = model
    name, tok = want["other"]
    grammar = f'root ::= {name} "\\"" [^"]* "\\""'
    pattern = rf"[\s\S]*?({name})[\s\S]*"
    s = GrammarSampler.lazy(vocab, grammar, trigger_patterns=[pattern])
    for t in vocab.tokenize("hello "):
        s.accept(t)
    assert s.awaiting_trigger
    s.accept(tok)  # the buffer holds the control token's text, so the pattern fires; the grammar gets the id
    assert not s.awaiting_trigger
    tokens = [*control_ids(vocab), *want["eog"]]
    assert not agreement(s, tokens).any() and s.mask()[want["quote"]]
    s.accept(want["quote"])
    assert not agreement(s, tokens).any()
    # a grammar spelling the control token as a literal refuses it on replay (llama.cpp would match the text)
    lit = GrammarSampler.lazy(vocab, f'root ::= "{name}" "\\""', trigger_patterns=[pattern])
    with pytest.raises(GrammarError, match=f"refuses control token {tok}"):
        lit.accept(tok)
