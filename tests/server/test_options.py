"""Options declared once (``options.py`` on ``ServerConfig``, ``ModelOptions``, ``Rules``, ``SpeculationConfig``
and the request ``Defaults``): the flags, their defaults and checks
come from the declarations, and ``--slot-prompt-similarity`` (llama-server's ``-sps``) is one of them."""

from __future__ import annotations

import dataclasses

import pytest
from tests.server.conftest import call, live_server

from samplechain.cli import build_parser, main
from samplechain.cli.common import command_parser
from samplechain.options import declared, declared_values
from samplechain.runtime.config import ModelOptions
from samplechain.runtime.decoding import Rules
from samplechain.server.config import Defaults, ServerConfig
from samplechain.speculative.config import SpeculationConfig


def serve_args(*argv: str):
    parser = build_parser()
    args = parser.parse_args(["serve", *argv])
    return args, command_parser(parser, args)


def test_every_declared_option_has_its_flag_and_its_default():
    args, parser = serve_args()
    values = declared_values(args, ServerConfig)
    defaults = {f.name: f.default for f in dataclasses.fields(ServerConfig)}
    assert values == {opt.name: defaults[opt.name] for opt in declared(ServerConfig)}  # -np -1 is the field's 4
    names = {o for a in parser._actions for o in a.option_strings}
    for opt in declared(ServerConfig):
        assert set(opt.flags) | set(opt.negative) <= names, opt.name
    assert len(declared(ServerConfig)) == 34  # 5 of them ModelOptions' (runtime/config.py), shared with generate


@pytest.mark.parametrize("command", ["generate", "serve"])
@pytest.mark.parametrize("cls", [ModelOptions, Rules, SpeculationConfig])
def test_shared_options_are_one_declaration_in_both_commands(command, cls):
    """How a model loads, the stop and limit rules and drafting: the same flags, defaults and checks in
    ``generate`` and ``serve``, from one declaration each."""
    parser = build_parser()
    args = parser.parse_args([command])
    sub = command_parser(parser, args)
    names = {o for a in sub._actions for o in a.option_strings}
    for opt in declared(cls):
        assert set(opt.flags) | set(opt.negative) <= names, opt.name
    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    if command == "generate" and cls is ModelOptions:
        defaults["n_ctx"] = 4096  # llama-cli's default context; serve's 0 is the model's
    assert declared_values(args, cls) == {opt.name: defaults[opt.name] for opt in declared(cls)}


def test_shared_options_land_in_their_fields():
    args, _ = serve_args("-n", "7", "--keep", "-1", "-r", "END", "-r", "", "-ctk", "f32", "--draft-max", "5",
                         "--spec-no-adaptive", "--spec-verify", "sample", "-a", "a, b", "-rea", "off", "--no-jinja",
                         "--no-cache-prompt")
    assert declared_values(args, Rules) == {"n_predict": 7, "n_keep": -1, "stop": ("END",)}
    assert declared_values(args, ModelOptions)["cache_type_k"] == "f32"
    spec = declared_values(args, SpeculationConfig)
    assert (spec["n_max"], spec["adaptive"], spec["verify"]) == (5, False, "sample")
    server = declared_values(args, ServerConfig)
    assert (server["alias"], server["enable_thinking"], server["use_jinja"]) == (("a", "b"), False, False)
    assert declared_values(args, Defaults) == {"cache_prompt": False, "verbose": False}
    for argv, shift in ((["--context-shift"], True), (["--context-shift", "--no-context-shift"], False)):
        assert declared_values(serve_args(*argv)[0], ServerConfig)["context_shift"] is shift


def test_flags_land_in_their_fields():
    args, _ = serve_args("-np", "2", "-c", "2048", "-sps", "0.5", "--no-kv-unified", "-kvu", "--no-slots", "--props",
                         "--sleep-idle-seconds", "30", "--port", "0")
    values = declared_values(args, ServerConfig)
    assert (values["n_slots"], values["n_ctx"], values["slot_prompt_similarity"]) == (2, 2048, 0.5)
    assert (values["kv_unified"], values["slots"], values["props"], values["sleep_idle_seconds"]) == (True, False,
                                                                                                      True, 30)


@pytest.mark.parametrize("argv, message", [
    (["-sps", "1.5"], "-sps/--slot-prompt-similarity must be within [0, 1], got 1.5"),
    (["-np", "0"], "-np/--parallel must be -1 (auto) or positive, got 0"),
    (["-n", "-2"], "-n/--n-predict must be -1 or more, got -2"),
    (["-ctv", "q9"], "-ctv/--cache-type-v: unsupported cache type 'q9'"),
    (["-rea", "maybe"], "--reasoning: unknown value 'maybe' (on, off or auto)"),
])
def test_a_declared_check_is_a_usage_error(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1


@pytest.mark.parametrize("similarity, same_slot", [(0.10, True), (0.0, False)])
def test_slot_prompt_similarity_picks_the_slot_that_holds_the_prompt(smol, similarity, same_slot):
    """With llama-server's default (0.10) a request whose prompt a slot holds goes to that slot and reuses its
    cells; 0 turns the match off: the least recently used slot takes it, and reads the prompt again."""
    body = {"prompt": "The quick brown fox jumps over the lazy dog.", "n_predict": 2, "temperature": 0}
    with live_server(smol, n_slots=2, n_ctx=512, slot_prompt_similarity=similarity) as s:
        first = call(s, "POST", "/completion", body).json()
        second = call(s, "POST", "/completion", body).json()
    assert (first["id_slot"] == second["id_slot"]) is same_slot
    assert first["timings"]["cache_n"] == 0
    assert (second["timings"]["cache_n"] > 0) is same_slot
    assert second["content"] == first["content"]
