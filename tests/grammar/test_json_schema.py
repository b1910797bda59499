"""JSON Schema -> GBNF (common/json-schema-to-grammar.cpp): llama.cpp's exact output, its failures, our fixes and
errors."""

import json
import warnings

import pytest
from tests.grammar.conftest import CASES, normalise

from samplechain.grammar import Grammar, GrammarError, json_schema_to_gbnf, server_response_schema


def convert(schema):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return json_schema_to_gbnf(schema)


@pytest.mark.parametrize("case", CASES["json_schema_to_grammar"], ids=lambda c: c["name"])
def test_llama_cpp_conversions(case):
    if case["status"] == "FAILURE":
        with pytest.raises(GrammarError):
            convert(case["schema"])
        return
    out = convert(case["schema"])
    assert normalise(out) == normalise(case["expected_grammar"])
    assert "root" in Grammar.from_gbnf(out).symbol_ids
    assert convert(json.loads(case["schema"])) == out  # text and parsed document agree


@pytest.mark.parametrize("case", [c for c in CASES["grammar_integration"] if c["kind"] == "schema"],
                         ids=lambda c: c["name"])
def test_integration_schemas_convert_to_the_same_grammar(case):
    assert normalise(convert(case["schema_json"])) == normalise(case["grammar"])


def accepts(grammar, text):
    m = grammar.matcher()
    return m.accept_str(text) and m.is_accepting()


def integer_grammar(**bounds):
    return Grammar.from_gbnf(convert({"type": "integer", **bounds}))


@pytest.mark.parametrize(
    "bounds",
    [{"minimum": 1005}, {"minimum": 2150}, {"minimum": 100, "maximum": 1005}, {"minimum": -1005},
     {"exclusiveMinimum": 9.5, "exclusiveMaximum": 2001}, {"maximum": -120}, {"minimum": 6.2, "maximum": 9.9}],
)
def test_integer_ranges_are_exact(bounds):
    # fixed: llama.cpp's grammar for minimum 1005 accepts 100, 1000 and 1004
    g = integer_grammar(**bounds)
    lo = bounds.get("minimum", bounds.get("exclusiveMinimum", -1e9))
    hi = bounds.get("maximum", bounds.get("exclusiveMaximum", 1e9))
    strict_lo, strict_hi = "exclusiveMinimum" in bounds, "exclusiveMaximum" in bounds
    for n in range(-3000, 3001):
        want = (n > lo if strict_lo else n >= lo) and (n < hi if strict_hi else n <= hi)
        assert accepts(g, str(n)) == want, n
    assert not accepts(g, "01") and not accepts(g, "1.0")


def test_q10_fixed_shape():
    assert convert({"type": "integer", "minimum": 1005}).startswith(
        "root ::= ([1] ([0] ([0] ([0-4] [0-9]{1,12} | [5-9] [0-9]{0,12}) | [1-9] [0-9]{1,13}) | [1-9] [0-9]{2,14})"
        " | [2-9] [0-9]{3,15})")


def test_string_with_allof_merges_instead_of_an_empty_object():
    # fixed: llama.cpp emits "{" space "}" for this schema
    g = Grammar.from_gbnf(convert({"type": "string", "allOf": [{"minLength": 2}, {"maxLength": 3}]}))
    assert accepts(g, '"abc"') and not accepts(g, '"a"') and not accepts(g, '"abcd"') and not accepts(g, "{}")


def test_object_rules_order_and_additional_properties():
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"},
                                               "c": {"type": "boolean"}},
              "required": ["a", "b"], "additionalProperties": {"type": "null"}}
    g = Grammar.from_gbnf(convert(schema))
    assert accepts(g, '{"b": 1, "a": "x"}')
    assert accepts(g, '{"b": 1, "a": "x", "c": true, "zz": null}')
    assert accepts(g, '{\n  "b":1,"a":"x"}')
    assert not accepts(g, '{"a": "x", "b": 1}')  # declared order
    assert not accepts(g, '{"b": 1}')
    assert not accepts(g, '{"b": 1, "a": "x", "zz": 1}')
    assert not accepts(g, '{"b": 1, "a": "x", "c": null}')


def test_recursive_refs_and_defs():
    schema = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                                  "kids": {"type": "array",
                                                                           "items": {"$ref": "#/$defs/node"}}},
                                 "required": ["v"]}},
              "$ref": "#/$defs/node"}
    g = Grammar.from_gbnf(convert(schema))
    assert accepts(g, '{"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": []}]}')
    assert not accepts(g, '{"v": 1, "kids": [{}]}')


def test_patterns_and_their_fallback():
    g = Grammar.from_gbnf(convert({"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}))
    assert accepts(g, '"AB-123"') and not accepts(g, '"AB-12"')
    with pytest.warns(UserWarning, match="not supported"):
        out = json_schema_to_gbnf({"type": "string", "pattern": "^\\d+$"})
    assert "root ::= string" in out
    with pytest.warns(UserWarning):
        json_schema_to_gbnf({"type": "string", "pattern": "no anchors"})


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "kaboom"}, "unrecognized type"),
        ({"type": 3}, "type must be"),
        ({"type": []}, "empty array"),
        ({"$ref": "https://example.com/s.json"}, "unsupported \\$ref"),
        ({"$ref": "#/definitions/missing"}, "Unresolved \\$ref"),
        ({"anyOf": []}, "non-empty"),
        ({"enum": []}, "non-empty"),
        ({"type": "array", "minItems": -1}, "minItems"),
        ({"type": "string", "maxLength": "3"}, "maxLength"),
        ({"type": "object", "additionalProperties": 3}, "additionalProperties"),
        ({"type": "object", "properties": []}, "properties must be an object"),
        ({"type": "integer", "minimum": "1"}, "minimum"),
        ({"type": "integer", "minimum": 5, "maximum": 4}, "empty"),
        ({"type": "integer", "minimum": 10**20}, "digits"),
        ({"type": "string", "pattern": "^(a$"}, "unbalanced"),
        ({"type": "string", "pattern": "^[ab$"}, "unterminated"),
        ({"type": "string", "pattern": "^*a$"}, "nothing before"),
        ({"type": "string", "pattern": "^a\\$"}, "trailing backslash"),
        ({"properties": {"a": True}}, "must be an object"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_schemas_raise_grammar_errors(schema, message):
    with pytest.raises(GrammarError, match=message):
        convert(schema)


ANY_VALUE_GRAMMAR = r"""array ::= "[" space ( value ("," space value)* )? space "]"
boolean ::= ("true" | "false")
char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})
decimal-part ::= [0-9]{1,16}
integral-part ::= [0] | [1-9] [0-9]{0,15}
null ::= "null"
number ::= ("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?
object ::= "{" space ( string ":" space value ("," space string ":" space value)* )? space "}"
root ::= value
space ::= | " " | "\n"{1,2} [ \t]{0,20}
string ::= "\"" char* "\""
value ::= object | array | string | number | boolean | null
"""


@pytest.mark.parametrize("schema", [{}, "{}", " { } ", {"description": "anything", "title": "t"}])
def test_schema_without_type_or_keywords_is_any_value(schema):
    # a schema without type or keywords is any value: root ::= value, with the whole value family
    assert convert(schema) == ANY_VALUE_GRAMMAR
    g = Grammar.from_gbnf(convert(schema))
    for doc in ('{"a": [1, null]}', "[]", '"s"', "-1.5e3", "true", "null"):
        assert accepts(g, doc), doc
    assert not accepts(g, "") and not accepts(g, "nul")


def test_server_response_schema_reads_an_empty_schema_as_any_object():
    # llama-server (oaicompat_chat_params_parse): an empty json_schema means {"type": "object"}
    assert server_response_schema({}) == {"type": "object"}
    out = convert(server_response_schema({}))
    assert out == ANY_VALUE_GRAMMAR.replace("root ::= value", "root ::= object")
    g = Grammar.from_gbnf(out)
    assert accepts(g, '{"a": [1, null]}') and accepts(g, "{}")
    assert not accepts(g, "[]") and not accepts(g, '"s"') and not accepts(g, "1")
    other = {"type": "integer"}
    assert server_response_schema(other) is other  # anything else passes through unchanged
    assert server_response_schema({"description": "x"}) == {"description": "x"}


def test_deep_schemas_do_not_crash():
    deep = {"type": "object"}
    for _ in range(3000):
        deep = {"type": "array", "items": deep}
    with pytest.raises(GrammarError):
        convert(deep)


@pytest.mark.parametrize(("schema", "lo", "hi"), [
    # Claude Code's tool schemas bound integers by JSON's safe integers (2**53 - 1, 16 digits)
    ({"type": "integer", "minimum": 0, "maximum": 2**53 - 1}, 0, 2**53 - 1),
    ({"type": "integer", "exclusiveMinimum": 0, "maximum": 2**53 - 1}, 1, 2**53 - 1),
    ({"type": "integer", "minimum": -(2**53 - 1), "maximum": 2**53 - 1}, -(2**53 - 1), 2**53 - 1),
    ({"type": "integer", "maximum": 2**53 - 1}, -(10**16 - 1), 2**53 - 1),
    ({"type": "integer", "minimum": 1234567890123456}, 1234567890123456, 10**16 - 1),
])
def test_integer_bounds_of_sixteen_digits(schema, lo, hi):
    grammar = Grammar.from_gbnf(json_schema_to_gbnf(schema))

    def takes(n: int) -> bool:
        m = grammar.matcher()
        return m.accept_str(str(n)) and m.is_accepting()

    for n in (lo, hi, lo + 1, hi - 1, 0, 7, -7, 10**15, -(10**15), 2**53, -(2**53)):
        assert takes(n) == (lo <= n <= hi), n
    assert not takes(lo - 1) and not takes(hi + 1)
