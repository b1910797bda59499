"""The matcher (src/llama-grammar.cpp): llama.cpp's integration cases, initial stacks, rejects, partial UTF-8,
tokens."""

import pytest
from tests.grammar.conftest import CASES, feed

from samplechain.grammar import Grammar, json_schema_to_gbnf
from samplechain.grammar.parser import TYPE_NAMES, ParsedGrammar


def _integration_grammar(case):
    text = json_schema_to_gbnf(case["schema_json"]) if case["kind"] == "schema" else case["grammar"]
    return Grammar.from_gbnf(text)


@pytest.mark.parametrize("case", CASES["grammar_integration"], ids=lambda c: c["name"])
def test_integration_cases(case):
    g = _integration_grammar(case)
    for text in case["passes"]:
        assert feed(g.matcher(), text), f"should pass: {text!r}"
    for text in case["fails"]:
        assert not feed(g.matcher(), text), f"should fail: {text!r}"


def test_initial_stacks_and_rejects_of_the_hand_built_table():
    case = CASES["llama_grammar_stacks_and_rejects"]
    rules = [[(TYPE_NAMES.index(t), v) for t, v in rule] for rule in case["rules"]]
    g = Grammar(ParsedGrammar(rules, case["symbol_ids"]), case["root"])
    stacks = [[[TYPE_NAMES[g.types[p]], g.values[p]] for p in s] for s in g.initial.stacks]
    assert stacks == case["expected_stacks"]  # llama.cpp's order too
    for k, expected in enumerate(case["expected_rejects"]):
        rejects = [[i, cp] for i, cp in enumerate(range(37, 61))  # the C++ test also has "<" (60)
                   if not g.feed_code_points([g.initial.stacks[k]], [cp])]
        assert rejects[: len(expected)] == expected


def test_refused_input_leaves_the_state_unchanged():
    g = Grammar.from_gbnf('root ::= "ab" "c"?')
    m = g.matcher()
    assert m.accept_str("a")
    before = m.state
    assert not m.accept_str("x")
    assert not m.accept_token(5, b"bx")
    assert m.state is before
    assert m.accept_token(5, b"b") and m.is_accepting()
    assert m.accept_str("c") and m.is_accepting()
    assert not m.accept_str("c")


def test_partial_utf8_across_tokens():
    g = Grammar.from_gbnf('root ::= "caf" [\\u00e9] "!"')
    m = g.matcher()
    assert m.accept_token(1, b"caf\xc3")  # ends inside a two-byte character that can still become [é]
    assert not m.is_accepting()
    assert not m.clone().accept_token(2, b"!")  # the pending character must be completed first
    assert not m.clone().accept_token(2, b"\xa8")  # completes to è, not in the set
    assert m.accept_token(2, b"\xa9!") and m.is_accepting()
    # a partial character that can never match is refused at once
    assert not g.matcher().accept_token(1, b"caf\xe2")
    # invalid UTF-8 is refused
    assert not Grammar.from_gbnf("root ::= [^x]*").matcher().accept_token(1, b"\x80")


def test_multibyte_characters_are_one_code_point():
    g = Grammar.from_gbnf('root ::= [😀-😏] "é" .')
    m = g.matcher()
    assert m.accept_token(1, "😃é".encode()) and m.accept_token(2, "中".encode()) and m.is_accepting()


def test_token_elements_match_by_id_only_at_a_token_start():
    g = Grammar.from_gbnf("root ::= <[10]> content <[11]>\ncontent ::= (!<[11]>)*")
    m = g.matcher()
    assert not m.clone().accept_token(11, b"<[11]>")
    assert m.accept_token(10, b"anything")
    assert m.accept_token(12, b"x") and m.accept_token(13, b"yy")
    assert not m.is_accepting()
    assert m.accept_token(11, b"") and m.is_accepting()
    assert not m.accept_token(11, b"")
    # a character set never consumes a token element, and text never satisfies one mid-token
    g = Grammar.from_gbnf('root ::= "a" <[7]>')
    assert not g.matcher().accept_token(7, b"ab")  # 'a' by text, then the element would need the rest
    m = g.matcher()
    assert m.accept_token(7, b"a") and not m.is_accepting()  # the text 'a' matched the character
    assert m.accept_token(7, b"a") and m.is_accepting()  # and now id 7 matches the element


def test_accept_str_and_accept_token_agree():
    g = Grammar.from_gbnf('root ::= ("ab" | "a" "c")+ "."')
    a, b = g.matcher(), g.matcher()
    assert a.accept_str("abac.")
    for piece in (b"a", b"ba", b"c", b"."):
        assert b.accept_token(0, piece)
    assert a.state is b.state and a.is_accepting()


def test_json_like_recursion_accepts_deep_nesting():
    g = Grammar.from_gbnf('root ::= v\nv ::= "[" (v ("," v)*)? "]" | [0-9]')
    m = g.matcher()
    text = "[" * 300 + "1" + "]" * 300
    assert m.accept_str(text) and m.is_accepting()
    assert not g.matcher().accept_str("[" * 10 + "]" * 11)
