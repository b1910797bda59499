"""Backend sampling in the runtime: the same text as the CPU chain, for the same seed."""

import pytest

from samplechain import SamplingParams
from samplechain.cli import main


@pytest.mark.parametrize("params", [
    dict(seed=5),
    dict(seed=9, temperature=1.2, top_k=0, top_p=0.9, repeat_penalty=1.3, frequency_penalty=0.2),
    dict(seed=2, dynatemp_range=0.4, logit_bias=((13, 2.0),)),
])
@pytest.mark.parametrize("mode", [dict(backend_sampling=True), dict(backend_sampling=True, backend_dist=True)])
def test_same_text_as_without(any_model, params, mode):
    prompt = "Once upon a time"
    want = "".join(any_model.generate(prompt, SamplingParams(**params), n_predict=24))
    got = "".join(any_model.generate(prompt, SamplingParams(**params, **mode), n_predict=24))
    assert got == want


def test_grammar_turns_backend_sampling_off(smol, capsys):
    params = SamplingParams(seed=1, grammar='root ::= "yes" | "no"', backend_sampling=True, backend_dist=True)
    assert "".join(smol.generate("Answer:", params, n_predict=4)) in ("yes", "no")
    assert "backend sampling is off" in capsys.readouterr().err


@pytest.mark.parametrize("mode", [dict(backend_sampling=True), dict(backend_sampling=True, backend_dist=True)])
def test_n_probs_with_backend_sampling(smol, mode):
    """Model.on_token sees the same post-sampling probabilities (bitwise) whether the step ran on the device."""
    def run(**extra):
        seen = []
        smol.on_token = lambda token, sampler: seen.append((token, sampler.top_probs(5)))
        try:
            text = "".join(smol.generate("The capital of France is", SamplingParams(seed=7, n_probs=5, **extra),
                                         n_predict=12))
        finally:
            smol.on_token = None
        return text, seen

    want_text, want = run()
    got_text, got = run(**mode)
    assert got_text == want_text
    assert got == want
    assert len(got) == 12 and all(len(top) >= 1 and top[0][1] > 0.0 for _, top in got)


@pytest.mark.parametrize("flags", [["-bs"], ["--backend-sampling"], ["--backend-dist"]])
def test_cli_flags_give_the_same_text(flags, capsys):
    base = ["generate", "-p", "The capital of France is", "-n", "16", "-s", "7", "--no-perf"]
    assert main(base) == 0
    want = capsys.readouterr().out
    assert main(base + flags) == 0
    assert capsys.readouterr().out == want


def test_cli_n_probs_with_backend_sampling(capsys):
    base = ["generate", "-p", "The capital of France is", "-n", "6", "-s", "7", "--no-perf", "--n-probs", "3"]
    assert main(base) == 0
    want = capsys.readouterr()
    assert main([*base, "-bs"]) == 0
    got = capsys.readouterr()
    assert got.out == want.out
    lines = [line for line in got.err.splitlines() if " <- " in line]
    assert len(lines) == 6 and lines == [line for line in want.err.splitlines() if " <- " in line]
