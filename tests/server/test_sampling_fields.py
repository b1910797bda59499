"""llama-server's sampling request fields (tools/server/server-schema.cpp) and the one declaration per parameter
behind them."""

import argparse
import dataclasses
import math

import pytest

from samplechain import DEFAULT_SEED, SamplingParams
from samplechain.cli import build_parser
from samplechain.cli.common import add_sampling_arguments, params_from_args
from samplechain.param_specs import declarations, flag, param, soft
from samplechain.server.sampling_fields import FieldError, parse_sampling_fields
from samplechain.validate import check_number, cli_number

DEFAULTS = SamplingParams(temperature=0.0, top_k=5, seed=7, dry_base=2.0, logit_bias=[[9, 1.0]])
INT32_MAX = 2**31 - 1


def parse(body, defaults=DEFAULTS, **kwargs):
    return parse_sampling_fields(body, defaults, **kwargs)


# --- absent, null, unknown ------------------------------------------------------------------------------------

def test_absent_and_null_fields_keep_the_defaults():
    assert parse({}) == DEFAULTS
    assert parse({"temperature": None, "top_k": None, "seed": None, "logit_bias": None}) == DEFAULTS
    assert parse({}).temperature == 0.0  # a server started with --temp 0 stays greedy


def test_unknown_and_non_sampling_fields_are_ignored():
    body = {"prompt": "hi", "stream": True, "n_predict": 3, "stop": ["."], "temprature": 5,
            "temp": 2.0, "penalty_repeat": 3.0,  # llama.cpp's internal names are not request fields
            "no_perf": True, "n_prev": 5, "backend_dist": True, "reasoning_budget_forced": [1]}
    assert parse(body) == DEFAULTS


def test_the_defaults_are_not_modified():
    before = dataclasses.replace(DEFAULTS)
    parse({"temperature": 0.5, "logit_bias": [[1, 2.0]]})
    assert DEFAULTS == before


def test_a_body_that_is_not_an_object():
    with pytest.raises(FieldError, match="JSON object"):
        parse([1, 2])


# --- aliases ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, field, value", [
    ({"n_probs": 2, "logprobs": 5}, "n_probs", 2),
    ({"logprobs": 5, "n_probs": 2}, "n_probs", 2),
    ({"logprobs": 5}, "n_probs", 5),
    ({"n_probs": None, "logprobs": 5}, "n_probs", 5),
    ({"reasoning_budget_tokens": 3, "thinking_budget_tokens": 9}, "reasoning_budget_tokens", 3),
    ({"thinking_budget_tokens": 9}, "reasoning_budget_tokens", 9),
    ({"reasoning_budget_end_tag": "x", "reasoning_budget_end_tags": ["y"]}, "reasoning_budget_end_tags", ("y",)),
    ({"reasoning_budget_end_tag": "</think>"}, "reasoning_budget_end_tags", ("</think>",)),
])
def test_aliases_in_priority_order(body, field, value):
    assert getattr(parse(body), field) == value


def test_the_alias_used_is_named_in_errors():
    with pytest.raises(FieldError) as e:
        parse({"thinking_budget_tokens": -5})
    assert str(e.value) == ("Field 'thinking_budget_tokens': Value must be between -1 <= value <= 2147483647, "
                            "but got -5")
    assert e.value.field == "thinking_budget_tokens"


# --- soft limits: clamped silently ----------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, expected", [
    ("top_p", 1.5, 1.0), ("top_p", -0.5, 0.0), ("min_p", -0.1, 0.0), ("min_p", 2, 1.0),
    ("temperature", -1, 0.0), ("temperature", 1e9, 1e9),
    ("top_k", -5, 0), ("top_k", 2**40, INT32_MAX), ("top_k", 40.0, 40),
    ("mirostat", 7, 2), ("mirostat", -1, 0),
    ("xtc_probability", 2, 1.0), ("xtc_threshold", -1, 0.0),
    ("adaptive_target", 3.0, 1.0), ("adaptive_target", -7.5, -7.5),
    ("n_probs", -3, 0),
])
def test_soft_limits_clamp(field, value, expected):
    got = getattr(parse({field: value}), field)
    assert got == expected and type(got) is type(expected)


# --- hard limits: llama-server's message, to the character ------------------------------------------------------

@pytest.mark.parametrize("body, message", [
    ({"repeat_last_n": -2}, "Field 'repeat_last_n': Value must be between 0 <= value <= 2147483647, but got -2"),
    ({"repeat_last_n": 2**31}, "Field 'repeat_last_n': Value must be between 0 <= value <= 2147483647, "
                               "but got 2147483648"),
    ({"dry_allowed_length": -1}, "Field 'dry_allowed_length': Value must be between 0 <= value <= 2147483647, "
                                 "but got -1"),
    ({"dry_penalty_last_n": -1}, "Field 'dry_penalty_last_n': Value must be between 0 <= value <= 2147483647, "
                                 "but got -1"),
    ({"min_keep": -1}, "Field 'min_keep': Value must be between 0 <= value <= 2147483647, but got -1"),
    ({"reasoning_budget_tokens": -2}, "Field 'reasoning_budget_tokens': Value must be between -1 <= value <= "
                                      "2147483647, but got -2"),
    ({"adaptive_decay": 1.5}, "Field 'adaptive_decay': Value must be between 0.000000 <= value <= 0.990000, "
                              "but got 1.500000"),
    ({"adaptive_decay": -0.25}, "Field 'adaptive_decay': Value must be between 0.000000 <= value <= 0.990000, "
                                "but got -0.250000"),
])
def test_hard_limits_are_errors(body, message):
    with pytest.raises(FieldError) as e:
        parse(body)
    assert str(e.value) == message


def test_values_at_the_hard_limits_are_taken():
    p = parse({"repeat_last_n": 0, "min_keep": INT32_MAX, "adaptive_decay": 0.99, "reasoning_budget_tokens": -1})
    assert (p.repeat_last_n, p.min_keep, p.adaptive_decay, p.reasoning_budget_tokens) == (0, INT32_MAX, 0.99, -1)


# --- JSON types -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, message", [
    ({"top_k": "many"}, "Field 'top_k': [json.exception.type_error.302] type must be number, but is string"),
    ({"temperature": [1]}, "Field 'temperature': [json.exception.type_error.302] type must be number, but is array"),
    ({"repeat_last_n": {}}, "Field 'repeat_last_n': [json.exception.type_error.302] type must be number, "
                            "but is object"),
    ({"ignore_eos": 1}, "Field 'ignore_eos': [json.exception.type_error.302] type must be boolean, but is number"),
    ({"post_sampling_probs": "yes"}, "Field 'post_sampling_probs': [json.exception.type_error.302] type must be "
                                     "boolean, but is string"),
    ({"grammar": 3}, "Field 'grammar': [json.exception.type_error.302] type must be string, but is number"),
    ({"logprobs": "3"}, "Field 'logprobs': [json.exception.type_error.302] type must be number, but is string"),
    ({"top_k": 1.5}, "Field 'top_k': expected an integer, got 1.5"),
])
def test_wrong_types_are_errors(body, message):
    with pytest.raises(FieldError) as e:
        parse(body)
    assert str(e.value) == message


@pytest.mark.parametrize("field, value, expected", [
    ("temperature", True, 1.0), ("top_p", False, 0.0), ("top_k", True, 1), ("mirostat", True, 1),
    ("repeat_last_n", False, 0), ("n_probs", True, 1), ("seed", True, 1),
])
def test_booleans_count_as_numbers(field, value, expected):
    assert getattr(parse({field: value}), field) == expected


@pytest.mark.parametrize("body, field", [
    ({"repeat_penalty": 0}, "repeat_penalty"),
    ({"frequency_penalty": math.inf}, "frequency_penalty"),
    ({"temperature": math.nan}, "temperature"),
    ({"seed": 2**32}, "seed"),
    ({"seed": -7}, "seed"),
    ({"grammar_triggers": [{"type": 9, "value": "x"}]}, "grammar_triggers"),
    ({"preserved_tokens": [1]}, "preserved_tokens"),
    ({"reasoning_budget_start_tag": 5}, "reasoning_budget_start_tag"),
])
def test_invalid_values_are_field_errors_naming_the_field(body, field):
    with pytest.raises(FieldError) as e:
        parse(body)
    assert str(e.value).startswith(f"Field '{field}': ") and e.value.field == field
    assert isinstance(e.value, ValueError)


# --- fields with rules of their own ---------------------------------------------------------------------------

def test_seed():
    assert parse({"seed": -1}).seed == DEFAULT_SEED
    assert parse({"seed": 42}).seed == 42
    assert parse({}).seed == 7
    with pytest.raises(FieldError) as e:
        parse({"seed": 2**32})
    assert str(e.value) == "Field 'seed': seed must be in [0, 4294967295] or -1 for a random seed, got 4294967296"


def test_dry_base_below_one_is_the_servers_default():
    assert parse({"dry_base": 0.5}).dry_base == 2.0
    assert parse({"dry_base": 0.5}, SamplingParams()).dry_base == 1.75
    assert parse({"dry_base": 1.0}).dry_base == 1.0 and parse({"dry_base": 3}).dry_base == 3.0


@pytest.mark.parametrize("value", [[], "abc", [1], ["a", 2], {"a": 1}])
def test_dry_sequence_breakers_must_be_a_non_empty_string_array(value):
    with pytest.raises(FieldError) as e:
        parse({"dry_sequence_breakers": value})
    assert str(e.value) == ("Field 'dry_sequence_breakers': Error: dry_sequence_breakers must be a non-empty array "
                            "of strings")


def test_dry_sequence_breakers():
    assert parse({"dry_sequence_breakers": ["\n", "x"]}).dry_sequence_breakers == ("\n", "x")


@pytest.mark.parametrize("value, expected", [
    ("kt", ("top_k", "temperature")),
    (["top_k", "MIN-P", "temp", "nucleus"], ("top_k", "min_p", "temperature", "top_p")),
    ("", ()),
    ([], ()),
])
def test_samplers_as_names_or_letters(value, expected):
    assert parse({"samplers": value}).samplers == expected


@pytest.mark.parametrize("value, message", [
    ("kq", "unknown sampler code 'q'"),
    (["top_k", "greedy"], "unknown sampler name 'greedy'"),
    (5, "must be an array of names or a string of one-letter codes"),
])
def test_bad_samplers(value, message):
    with pytest.raises(FieldError, match=f"^Field 'samplers': {message}"):
        parse({"samplers": value})


@pytest.mark.parametrize("value, expected", [
    ([[1, 2], [4, False], ["ab", -1.5]], ((1, 2.0), (4, -math.inf), ("ab", -1.5))),
    ({"15": False, "2": 0.5, "ab": 1}, ((15, -math.inf), (2, 0.5), ("ab", 1.0))),
    # object keys are ids when strtol reads them whole (leading blanks, a sign; "" reads as 0)
    ({" 7": 1, "+8": 1, "x7": 1, "": 2}, ((7, 1.0), (8, 1.0), ("x7", 1.0), (0, 2.0))),
    ([], ()),
    ({}, ()),
])
def test_logit_bias_forms(value, expected):
    assert parse({"logit_bias": value}).logit_bias == expected


# malformed biases are a 400 (llama-server skips them silently, so a typo biases nothing)
@pytest.mark.parametrize("value, message", [
    ([[2]], "logit_bias entries must be [token, bias] pairs, got [2]"),
    (["x"], "logit_bias entries must be [token, bias] pairs, got 'x'"),
    ([[-1, 3]], "logit_bias token id must be >= 0, got -1"),
    ({"-1": 3}, "logit_bias token id must be >= 0, got -1"),
    ([[5.0, 1]], "logit_bias token must be an id or a text, got 5.0"),
    ([[True, 1]], "logit_bias token must be an id or a text, got True"),
    ([[3, True]], "logit_bias of 3 must be a number, got True"),
    ({"3": "lots"}, "logit_bias of 3 must be a number, got 'lots'"),
    ([[1, 2, 3]], "logit_bias entries must be [token, bias] pairs, got [1, 2, 3]"),
    (5, "logit_bias must be a list of [token, bias] pairs or an object, got 5"),
    ("15", "logit_bias must be a list of [token, bias] pairs or an object, got '15'"),
])
def test_bad_logit_bias_is_an_error(value, message):
    with pytest.raises(FieldError) as e:
        parse({"logit_bias": value})
    assert str(e.value) == f"Field 'logit_bias': {message}"


def test_logit_bias_ids_outside_the_vocabulary_are_skipped():
    body = {"logit_bias": [[3, 1.0], [100, 1.0], [99, -1.0], ["text", 2.0]]}
    assert parse(body, n_vocab=100).logit_bias == ((3, 1.0), (99, -1.0), ("text", 2.0))
    assert parse(body).logit_bias == ((3, 1.0), (100, 1.0), (99, -1.0), ("text", 2.0))


def test_logit_bias_absent_keeps_the_servers():
    assert parse({}).logit_bias == ((9, 1.0),)
    assert parse({"logit_bias": [[1, 0.5]]}).logit_bias == ((1, 0.5),)


def test_ignore_eos_and_other_booleans():
    p = parse({"ignore_eos": True, "post_sampling_probs": True, "backend_sampling": True, "grammar_lazy": False})
    assert (p.ignore_eos, p.post_sampling_probs, p.backend_sampling, p.grammar_lazy) == (True, True, True, False)


SCHEMA = {"type": "integer"}
GBNF = 'root ::= "a"'


def test_json_schema_is_used_only_without_grammar():
    p = parse({"json_schema": SCHEMA})
    assert (p.json_schema, p.grammar) == (SCHEMA, "")
    p = parse({"json_schema": SCHEMA, "grammar": GBNF})
    assert (p.json_schema, p.grammar) == (None, GBNF)
    p = parse({"json_schema": SCHEMA, "grammar": None})  # null = absent
    assert (p.json_schema, p.grammar) == (SCHEMA, "")


def test_a_requests_constraint_replaces_the_servers():
    schema_server = SamplingParams(json_schema=SCHEMA)
    assert (parse({"grammar": GBNF}, schema_server).json_schema, parse({"grammar": GBNF}, schema_server).grammar) \
        == (None, GBNF)
    grammar_server = SamplingParams(grammar=GBNF)
    p = parse({"json_schema": {}}, grammar_server)
    assert (p.json_schema, p.grammar) == ({}, "")
    # an empty grammar keeps the server's constraint (and hides the request's json_schema)
    assert parse({"grammar": ""}, grammar_server) == grammar_server
    assert parse({"grammar": "", "json_schema": SCHEMA}, schema_server) == schema_server


def test_an_invalid_json_schema_is_a_field_error():
    with pytest.raises(FieldError) as e:
        parse({"json_schema": {"type": "nonsense"}})
    assert str(e.value) == "Field 'json_schema': \"json_schema\": unrecognized type 'nonsense'"
    with pytest.raises(FieldError, match=r"^Field 'json_schema': must be an object"):
        parse({"json_schema": [1]})


def test_lazy_grammar_fields():
    p = parse({"grammar": GBNF, "grammar_lazy": True, "preserved_tokens": ["<tool>"],
               "grammar_triggers": [{"type": 1, "value": "<tool>"}, {"type": 0, "value": "<t>", "token": 5}]})
    assert p.grammar_lazy and p.preserved_tokens == ("<tool>",)
    assert p.grammar_triggers == ((1, "<tool>", None), (0, "<t>", 5))
    for body in ({"grammar_triggers": "x"}, {"preserved_tokens": "x"}):
        with pytest.raises(FieldError, match="must be an array"):
            parse(body)


def test_reasoning_budget_fields():
    p = parse({"reasoning_budget_tokens": 16, "reasoning_budget_start_tag": "<think>",
               "reasoning_budget_end_tags": ["</think>", ""], "reasoning_budget_message": "Done.",
               "reasoning_control": True, "generation_prompt": "<think>"})
    assert (p.reasoning_budget_tokens, p.reasoning_budget_start_tag, p.reasoning_budget_end_tags) == (
        16, "<think>", ("</think>",))
    assert (p.reasoning_budget_message, p.reasoning_control, p.generation_prompt) == ("Done.", True, "<think>")
    with pytest.raises(FieldError, match=r"^Field 'reasoning_budget_end_tag': "):
        parse({"reasoning_budget_end_tag": 3})


def test_the_server_defaults_come_from_its_flags():
    parser = argparse.ArgumentParser()
    add_sampling_arguments(parser)
    defaults = params_from_args(parser.parse_args(["--temp", "0", "--top-k", "3", "-s", "11",
                                                   "--grammar", GBNF]))
    assert parse({}, defaults) == defaults
    p = parse({"temperature": 0.7}, defaults)
    assert (p.temperature, p.top_k, p.seed, p.grammar) == (0.7, 3, 11, GBNF)


# --- one declaration per parameter ------------------------------------------------------------------------------

def test_every_field_is_declared_exactly_once():
    decls = declarations(SamplingParams)
    assert [d.name for d in decls] == [f.name for f in dataclasses.fields(SamplingParams)]
    assert all(d.default == f.default for d, f in zip(decls, dataclasses.fields(SamplingParams), strict=True))
    for names in ([n for d in decls for n in d.request_names], [n for d in decls for n in d.dict_names],
                  [s for d in decls for f in d.cli for s in f.names]):
        assert len(names) == len(set(names))  # no name belongs to two parameters


def test_an_undeclared_field_is_refused():
    @dataclasses.dataclass
    class Undeclared(SamplingParams):
        extra: int = 0

    with pytest.raises(TypeError, match=r"Undeclared\.extra is not declared"):
        Undeclared()


def test_the_servers_field_names_are_llama_servers():
    names = {n for d in declarations(SamplingParams) for n in d.request_names}
    assert names == {
        "seed", "n_probs", "logprobs", "min_keep", "top_k", "top_p", "min_p", "xtc_probability", "xtc_threshold",
        "typical_p", "temperature", "dynatemp_range", "dynatemp_exponent", "repeat_last_n", "repeat_penalty",
        "frequency_penalty", "presence_penalty", "dry_multiplier", "dry_base", "dry_allowed_length",
        "dry_penalty_last_n", "dry_sequence_breakers", "adaptive_target", "adaptive_decay", "mirostat",
        "top_n_sigma", "mirostat_tau", "mirostat_eta", "ignore_eos", "post_sampling_probs", "backend_sampling",
        "samplers", "logit_bias", "grammar", "json_schema", "grammar_lazy", "grammar_triggers", "preserved_tokens",
        "generation_prompt", "reasoning_budget_tokens", "thinking_budget_tokens", "reasoning_budget_start_tag",
        "reasoning_budget_end_tags", "reasoning_budget_end_tag", "reasoning_budget_message", "reasoning_control",
    }


def _options(parser_or_group):
    return {s for a in parser_or_group._group_actions for s in a.option_strings}


def test_the_generate_flags_are_the_declared_flags():
    generate = build_parser()._subparsers._group_actions[0].choices["generate"]
    groups = {g.title: g for g in generate._action_groups}
    declared = {s for d in declarations(SamplingParams) for f in d.cli for s in f.names}
    assert _options(groups["sampling (llama.cpp's flags and defaults)"]) | _options(groups["constrained output"]) \
        == declared
    assert {"--temp", "--temperature", "-s", "--seed", "--samplers", "--sampling-seq", "-l", "--no-perf",
            "--grammar", "-jf", "--reasoning-budget"} <= declared


@dataclasses.dataclass
class WithFoo(SamplingParams):
    """One more declared parameter: it gets a flag, a request field (and alias) and from_dict support."""

    foo_level: float = param(0.5, check=check_number, json=soft(0.0, 1.0), aliases=["foo"],
                             cli=[flag("--foo-level", type=cli_number)])


def test_a_new_declaration_adds_a_flag_and_a_request_field():
    parser = argparse.ArgumentParser()
    add_sampling_arguments(parser, params_type=WithFoo)
    assert "--foo-level" in parser._option_string_actions
    assert params_from_args(parser.parse_args([]), params_type=WithFoo).foo_level == 0.5
    defaults = params_from_args(parser.parse_args(["--foo-level", "0.25"]), params_type=WithFoo)
    assert isinstance(defaults, WithFoo) and defaults.foo_level == 0.25
    assert parse({}, defaults).foo_level == 0.25
    assert parse({"foo": 3}, defaults).foo_level == 1.0
    assert parse({"foo_level": 0.1, "foo": 0.9}, defaults).foo_level == 0.1
    assert WithFoo.from_dict({"foo": 0.75}).foo_level == 0.75
    with pytest.raises(FieldError, match=r"^Field 'foo': "):
        parse({"foo": "high"}, defaults)
    with pytest.raises(ValueError, match="foo_level must be finite"):
        WithFoo(foo_level=math.inf)
