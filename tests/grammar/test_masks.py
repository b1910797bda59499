"""Token masks (llama_grammar_apply_impl): exactly the tokens a transition accepts, on toy and real vocabularies."""

import json
import random

import numpy as np
import pytest

from samplechain import Vocab
from samplechain.grammar import Grammar, MaskEngine, TokenTable, json_schema_to_gbnf
from samplechain.runtime import model_path

JSON_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
"""

GRAMMARS = [
    JSON_GBNF,
    'root ::= "caf" [\\u00e9\\u20ac] "!"? | [^a-z]+ | "x"{2,5}',
    'root ::= ( "a" | "ab" | "abc" )* "c"?',
    "root ::= <tool> [a-c ]* </tool> | [\\u00e9]+",
    'root ::= [^"]* "\\"" [0-2]{1,3}',
]


def check_masks(grammar: Grammar, vocab: Vocab, steps: int, seed: int) -> int:
    """Random walks: at every state the mask equals, token by token, whether the transition exists."""
    engine = MaskEngine(grammar, TokenTable.of(vocab))
    rng = random.Random(seed)
    checked = 0
    for _ in range(3):
        state = grammar.initial
        for _ in range(steps):
            mask = engine.mask(state)
            for t in range(vocab.n_tokens):
                want = (() in state.stacks) if vocab.is_eog(t) else engine.transition(state, t) is not None
                assert bool(mask[t]) == want, (t, vocab.token_bytes(t), state.stacks)
                assert engine.allows(state, t) == want
                checked += 1
            choices = [int(t) for t in np.flatnonzero(mask) if not vocab.is_eog(int(t))]
            if not choices:
                break
            state = engine.transition(state, rng.choice(choices))
    return checked


@pytest.mark.parametrize("text", GRAMMARS, ids=range(len(GRAMMARS)))
def test_masks_equal_transitions_on_a_toy_vocabulary(text, toy_vocab):
    g = Grammar.from_gbnf(text, vocab=toy_vocab)
    assert check_masks(g, toy_vocab, 25, seed=1) > 0


def test_masks_on_a_real_vocabulary_along_a_document():
    vocab = Vocab.from_gguf(model_path("smollm2"))
    g = Grammar.from_gbnf(JSON_GBNF)
    engine = MaskEngine(g, TokenTable.of(vocab))
    doc = json.dumps({"name": "Zoë 😀 \"q\"", "n": [-1.5e3, 0, {}], "ok": [True, None], "u": "\u00e9\\n"}, indent=1,
                     ensure_ascii=False)
    state = g.initial
    rng = np.random.default_rng(0)
    for i, tok in enumerate(vocab.tokenize(doc)):
        mask = engine.mask(state)
        assert mask[tok]
        sample = np.concatenate([rng.choice(vocab.n_tokens, 400, replace=False), np.flatnonzero(mask)[:100]])
        for t in sample.tolist():
            want = (() in state.stacks) if vocab.is_eog(t) else engine.transition(state, t) is not None
            assert bool(mask[t]) == want, (i, t, vocab.token_bytes(t))
        state = engine.transition(state, tok)
    assert state.accepting
    assert engine.mask(state)[sorted(vocab.eog)].all()


def test_end_of_generation_only_when_complete(toy_vocab):
    g = Grammar.from_gbnf('root ::= "ab" "c"?')
    engine = MaskEngine(g, TokenTable.of(toy_vocab))
    assert not engine.mask(g.initial)[1]
    state = engine.transition(g.initial, 12)  # "ab"
    assert engine.mask(state)[1] and engine.mask(state)[11]  # "</s>" and "c"
    # empty, NUL-led and invalid pieces are never allowed by text
    assert not engine.mask(Grammar.from_gbnf("root ::= .*").initial)[[42, 47, 40, 41]].any()


def test_masks_of_a_converted_schema_follow_the_schema(toy_vocab):
    g = Grammar.from_gbnf(json_schema_to_gbnf({"type": "object", "properties": {"a": {"type": "boolean"}},
                                               "required": ["a"]}))
    check_masks(g, toy_vocab, 20, seed=3)
