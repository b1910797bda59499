"""Draft-model speculation in ``serve`` (``-md`` with ``--spec-type draft-simple``): each slot drafts with its own
sequence of one draft context, and every request gets the tokens it gets without drafting (llama.cpp's server test
``test_speculative.py``, with SmolLM2 as its own draft model)."""

import concurrent.futures

import pytest
from tests.server.conftest import call, live_server

from samplechain.runtime.speculation import LinearCost, Speculation
from samplechain.speculative.config import SpeculationConfig

REQUEST = {"prompt": "I believe the meaning of life is", "temperature": 0.2, "top_k": 5, "seed": 4242,
           "n_predict": 16, "return_tokens": True}


@pytest.fixture(scope="module")
def plain(smol):
    """What the request gives without drafting."""
    with live_server(smol, n_slots=2, n_ctx=512) as s:
        return call(s, "POST", "/completion", REQUEST).json()


def test_same_tokens_with_a_draft_model(smol, plain):
    with live_server(smol, n_slots=2, n_ctx=512, metrics=True,
                     speculation=SpeculationConfig(("draft-simple",), n_max=8), model_draft=smol.path,
                     draft_params={"n_max": 8, "n_min": 4}) as s:
        alone = call(s, "POST", "/completion", REQUEST).json()
        with concurrent.futures.ThreadPoolExecutor(2) as ex:  # both slots drafting at once
            both = [f.result().json() for f in [ex.submit(call, s, "POST", "/completion", REQUEST)
                                                for _ in range(2)]]
        slots = call(s, "GET", "/slots").json()
    assert alone["tokens"] == plain["tokens"] and len(plain["tokens"]) == 16
    assert alone["timings"]["draft_n"] > 0 and alone["timings"]["draft_n_accepted"] > 0
    assert [b["tokens"] for b in both] == [plain["tokens"]] * 2
    assert {s["speculative"] for s in slots} == {True}


def test_serve_flags(monkeypatch, smol):
    from samplechain import cli

    got = {}
    monkeypatch.setattr("samplechain.server.app.serve", lambda config, log_level: got.setdefault("c", config) and 0)
    argv = ["serve", "-md", smol.path, "--spec-type", "draft-simple", "--spec-draft-n-max", "8",
            "--spec-draft-n-min", "4", "--embedding", "--pooling", "mean", "-b", "2048", "-ub", "256"]
    assert cli.main(argv) == 0
    c = got["c"]
    assert c.model_draft == smol.path and c.draft_params["n_max"] == 8 and c.draft_params["n_min"] == 4
    assert c.speculation.build().drafters == []  # no n-gram drafter: the slots add their draft model
    assert (c.speculation.types, c.speculation.n_max, c.speculation.n_min) == (("draft-simple",), 8, 4)
    assert c.embedding and c.pooling == "mean"
    assert c.n_batch == 256  # llama-server: with embeddings, n_batch = n_ubatch


def test_draft_simple_needs_a_draft_model(capsys):
    from samplechain import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--spec-type", "draft-simple"])
    assert e.value.code == 2
    assert "--spec-type draft-simple needs a draft model (-md)" in capsys.readouterr().err


def test_synthetic_acceptance(smol, plain, capsys):
    """``--spec-synth-rates`` (llama-server's benchmarking mode): rate 0 keeps no draft token (the tokens are
    plain decoding's), rate 1 keeps every one; the flags resolve as llama.cpp's and bad values are usage errors."""
    from samplechain import cli
    from samplechain.runtime.speculation import synth_probabilities

    def spec(rate: float) -> SpeculationConfig:
        return SpeculationConfig(("draft-simple",), n_max=8, synth_rates=(rate,) * 8)

    with live_server(smol, n_slots=1, n_ctx=512, speculation=spec(0.0), model_draft=smol.path,
                     draft_params={"n_max": 8, "n_min": 4}) as s:
        none = call(s, "POST", "/completion", REQUEST).json()
    with live_server(smol, n_slots=1, n_ctx=512, speculation=spec(1.0), model_draft=smol.path,
                     draft_params={"n_max": 8, "n_min": 4}) as s:
        every = call(s, "POST", "/completion", {**REQUEST, "temperature": 0.0}).json()
    assert none["tokens"] == plain["tokens"] and none["timings"]["draft_n"] > 0
    assert none["timings"]["draft_n_accepted"] == 0
    assert every["timings"]["draft_n"] > 0 and every["timings"]["draft_n_accepted"] == every["timings"]["draft_n"]
    assert synth_probabilities([0.75 ** (i + 1) for i in range(4)], None, 4) == (0.75,) * 4
    assert synth_probabilities(None, 5.0, 4) == (1.0,) * 4
    for argv, message in ((["--draft-max", "2", "--spec-synth-rates", "0.5,0.6"], "monotonically non-increasing"),
                          (["--spec-synth-rates", "0.5"], "must contain 16 values, got 1"),
                          (["--spec-synth-len", "2", "--spec-synth-rates", "0.5"], "mutually exclusive")):
        with pytest.raises(SystemExit) as e:
            cli.main(["serve", "--spec-type", "ngram-simple", *argv])
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_adaptive_length_never_below_draft_min():
    """With ``--draft-min`` the adaptive length is raised to it: a shorter cap dropped every draft, so nothing was
    ever drafted or measured (llama-server's test_speculative saw ``draft_n`` 0 with n_min 4)."""

    class Eight:
        name = "eight"

        def begin(self, prompt):
            pass

        def draft(self, history, id_last):
            return list(range(8))

        def accept(self, n_accepted, is_other=False):
            pass

    spec = Speculation([Eight()], n_max=8, n_min=4, cost=LinearCost(0.5))
    assert spec.best_length(spec.stats["eight"].rate, 8) == 1  # a dear verify batch alone picks a shorter draft
    assert spec.propose([1, 2], 3, 8) == [0, 1, 2, 3]
