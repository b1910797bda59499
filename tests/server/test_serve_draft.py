"""Draft-model speculation in ``serve`` (``-md`` with ``--spec-type draft-simple``): each slot drafts with its own
sequence of one draft context, and every request gets the tokens it gets without drafting (llama.cpp's server test
``test_speculative.py``, with SmolLM2 as its own draft model)."""

import concurrent.futures

import pytest
from tests.server.conftest import call, live_server

from samplechain.runtime.speculation import Speculation

REQUEST = {"prompt": "I believe the meaning of life is", "temperature": 0.2, "top_k": 5, "seed": 4242,
           "n_predict": 16, "return_tokens": True}


@pytest.fixture(scope="module")
def plain(smol):
    """What the request gives without drafting."""
    with live_server(smol, n_slots=2, n_ctx=512) as s:
        return call(s, "POST", "/completion", REQUEST).json()


def test_same_tokens_with_a_draft_model(smol, plain):
    with live_server(smol, n_slots=2, n_ctx=512, metrics=True, speculation=lambda: Speculation([], n_max=8),
                     model_draft=smol.path, draft_params={"n_max": 8, "n_min": 4}) as s:
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
    assert c.speculation().drafters == []  # no n-gram drafter: the slots add their draft model
    assert c.embedding and c.pooling == "mean"
    assert c.n_batch == 256  # llama-server: with embeddings, n_batch = n_ubatch


def test_draft_simple_needs_a_draft_model(capsys):
    from samplechain import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--spec-type", "draft-simple"])
    assert e.value.code == 2
    assert "--spec-type draft-simple needs a draft model (-md)" in capsys.readouterr().err
