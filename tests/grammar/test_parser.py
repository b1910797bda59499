"""GBNF parsing (llama_grammar_parser) and grammar construction checks (llama_grammar_init_impl), with the hazards as
errors."""

import pytest
from tests.grammar.conftest import CASES

from samplechain.grammar import Grammar, GrammarError, parse_gbnf
from samplechain.grammar.parser import TYPE_NAMES


def table(parsed):
    return [[[TYPE_NAMES[t], v] for t, v in rule] for rule in parsed.rules]


@pytest.mark.parametrize("case", CASES["grammar_parser"]["must_parse"], ids=lambda c: c["grammar"].strip()[:40])
def test_parser_tables_match_llama_cpp(case):
    parsed = parse_gbnf(case["grammar"], tokenize=None)
    assert parsed.symbol_ids == case["symbol_ids"]
    assert table(parsed) == case["rules"]


@pytest.mark.parametrize("text", CASES["grammar_parser"]["must_fail"], ids=lambda t: t.strip()[:40])
def test_parser_failures(text):
    with pytest.raises(GrammarError):
        parse_gbnf(text)


@pytest.mark.parametrize("case", CASES["grammar_build_failures"], ids=lambda c: c["name"])
def test_build_failures(case):
    with pytest.raises(GrammarError):
        Grammar.from_gbnf(case["grammar"], case["root"])


def test_custom_root_symbol():
    text = CASES["grammar_build_failures"][-1]["grammar"]
    g = Grammar.from_gbnf(text, "foobar")
    m = g.matcher()
    assert m.accept_str("foobar") and m.is_accepting()


@pytest.mark.parametrize(
    ("text", "message", "line", "column"),
    [
        ('root ::= "a"\nb ::= [a-', "unexpected end of input", 2, 10),
        ("root ::= x\n  ::= y", "expecting name", 2, 3),
        ('root "a"', "expecting ::=", 1, 6),
        ('root ::= "a" )', "expecting newline or end", 1, 14),
        ('root ::= ("a"', "expecting ')'", 1, 14),
        ('root ::= "\\q"', "unknown escape", 1, 11),
        ('root ::= "\\x4"', "expecting 2 hex chars", 1, 11),
        ('root ::= "\\u12g4"', "expecting 4 hex chars", 1, 11),
        ("root ::= *", "expecting preceding item to *", 1, 10),
        ('root ::= "a" | +', "expecting preceding item to +", 1, 16),
        ('root ::= ""*', "expecting preceding item to *", 1, 12),
        ("root ::= []?", "expecting preceding item to ?", 1, 12),
        ('root ::= "a"{x}', "expecting an int", 1, 14),
        ('root ::= "a"{2 3}', "expecting ','", 1, 16),
        ('root ::= "a"{2,3', "expecting '}'", 1, 17),
        ('root ::= "a"{3,2}', "maximum below its minimum", 1, 13),
        ('root ::= "a"{2001}', "exceeds sane defaults", 1, 13),
        ("root ::= <[12]", "expecting '>'", 1, 15),
        ("root ::= <[12>", "expecting ']'", 1, 14),
        ("root ::= <[]>", "expecting an int", 1, 12),
        ("root ::= <[4294967296]>", "too big", 1, 12),
        ("root ::= !x", "expecting '<'", 1, 11),
        ("root ::= <think>", "no vocab to parse token", 1, 10),
        ("root ::= numero", "Undefined rule identifier 'numero'", None, None),
    ],
)
def test_parse_errors_say_what_and_where(text, message, line, column):
    with pytest.raises(GrammarError) as e:
        parse_gbnf(text)
    assert message in str(e.value)
    assert (e.value.line, e.value.column) == (line, column)
    assert isinstance(e.value, ValueError)


def test_dangling_alternative_joins_the_next_line():
    # a GBNF pitfall: the trailing '|' swallows the newline, so 'b' becomes part of the rule
    with pytest.raises(GrammarError, match="expecting newline or end"):
        parse_gbnf('a ::= "x" |\nb ::= "y"')
    assert parse_gbnf('a ::= "x" |').rules[0][-2:] == [(1, 0), (0, 0)]


def test_line_structure_comments_and_escapes():
    text = '# comment\n\n  root ::= ( "a" # inside\n   | [\\x41-\\u0043\\]\\-] )\n# end\n'
    g = Grammar.from_gbnf(text)
    for ok in ("a", "A", "B", "C", "]", "-"):
        m = g.matcher()
        assert m.accept_str(ok) and m.is_accepting()
    assert not g.matcher().accept_str("D")
    # a dash before ']' is literal; [a-] = {a, -}; an inverted range matches nothing
    g = Grammar.from_gbnf('root ::= [a-] [z-a]?')
    assert g.matcher().accept_str("-")
    assert not g.matcher().accept_str("-z")


def test_redefinition_replaces_and_nul_ends_input():
    g = Grammar.from_gbnf('root ::= "a"\nroot ::= "b"')
    assert g.matcher().accept_str("b") and not g.matcher().accept_str("a")
    g = Grammar.from_gbnf('root ::= "a"\0 garbage that is never read')
    assert g.matcher().accept_str("a")


def test_upper_bound_above_limit_is_unbounded():
    assert table(parse_gbnf('root ::= "a"{0,5000}')) == table(parse_gbnf('root ::= "a"*'))


@pytest.mark.parametrize(
    "text",
    [
        # left recursion through an indirectly nullable rule (llama.cpp misses it and hangs)
        'root ::= a root "x" | "y"\na ::= b\nb ::= | "z"',
        'root ::= a\na ::= b a "q" | "r"\nb ::= c\nc ::= ("s")?',
        'root ::= "a" | root',
    ],
)
def test_left_recursion_through_nullable_rules_is_refused(text):
    with pytest.raises(GrammarError, match="left recursion"):
        Grammar.from_gbnf(text)


def test_tail_cycles_through_nullable_rules_are_fine():
    g = Grammar.from_gbnf("root ::= ( [x]* )*")  # llama.cpp's "segfault" case
    for text, ok in (("", True), ("x", True), ("xx", True), ("y", False)):
        m = g.matcher()
        assert (m.accept_str(text) and m.is_accepting()) == ok


def test_nesting_guard_and_deep_groups_are_errors_not_crashes():
    with pytest.raises(GrammarError, match="exceeds sane defaults"):
        parse_gbnf('root ::= ("a"{0,1000}){0,3}')  # 1001 generated rules, repeated 3 times
    parse_gbnf('root ::= ("a"{1000}){2}')  # an exact repetition generates no rules
    with pytest.raises(GrammarError, match="nested deeper"):
        parse_gbnf("root ::= " + "(" * 5000 + '"a"' + ")" * 5000)


def test_many_optional_items_stay_linear():
    g = Grammar.from_gbnf("root ::= " + " ".join(['"x"?'] * 200))
    m = g.matcher()
    assert m.accept_str("x" * 150) and m.is_accepting()
    assert len(m.stacks) <= 60
    assert not m.accept_str("x" * 51)


def test_token_items_with_a_vocabulary(toy_vocab):
    g = Grammar.from_gbnf("root ::= <tool> [a-c]+ </tool>", vocab=toy_vocab)
    ids = [r for r in g.rules[0] if r[0] == 8]
    assert ids == [(8, 45), (8, 46)]
    with pytest.raises(GrammarError, match="invalid token '<nope>'"):
        Grammar.from_gbnf("root ::= <nope>", vocab=toy_vocab)


def test_non_text_grammar_is_an_error():
    with pytest.raises(GrammarError):
        parse_gbnf(b"root ::= x")
