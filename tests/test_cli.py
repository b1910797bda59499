import subprocess
import sys

import pytest

from samplechain.cli import build_parser, main, params_from_args


def _run(*args):
    return subprocess.run([sys.executable, "-m", "samplechain", *args], capture_output=True, text=True, timeout=300)


def test_chat_answer_with_greedy_sampling():
    r = _run("generate", "-p", "What is the capital of France?", "--chat", "--temp", "0", "-n", "32")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    for line in ("load time", "prompt eval time", "eval time", "sampling time"):
        assert line in r.stderr


@pytest.mark.parametrize("args", [
    ["generate", "--bogus"], ["generate", "--mirostat", "3"], ["generate", "-n", "-5"], ["generate", "--top-k", "x"],
    ["generate", "--repeat-last-n", "-1"], ["generate", "-l", "12x"], ["generate", "--samplers", "nope"],
    ["generate", "-p", "a", "-f", "b"], ["generate", "-s", "99999999999"], ["frobnicate"], [],
])
def test_bad_flags_are_usage_errors(args, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_flags_map_to_llama_cpp_defaults():
    p = params_from_args(build_parser().parse_args(["generate"]))
    assert (p.top_k, p.top_p, p.min_p, p.temperature, p.repeat_last_n, p.seed) == (40, 0.95, 0.05, 0.8, 64, 0xFFFFFFFF)
    args = build_parser().parse_args([
        "generate", "-s", "-1", "--temp", "-3", "--sampler-seq", "kt", "-l", "15043+1", "-l", "2-inf",
        "--dry-sequence-breaker", "\\n", "--dry-sequence-breaker", "x", "--repeat-last-n", "128"])
    p = params_from_args(args)
    assert p.seed == 0xFFFFFFFF and p.temperature == 0.0 and p.samplers == ("top_k", "temperature")
    assert p.logit_bias == ((15043, 1.0), (2, float("-inf")))
    assert p.dry_sequence_breakers == ("\n", "x") and p.n_prev == 128
    none = params_from_args(build_parser().parse_args(["generate", "--dry-sequence-breaker", "none"]))
    assert none.dry_sequence_breakers == ()
