"""The kernel choice's timing rounds (pruning, early stop, what is chosen), its cache key and the line it prints, run
on fake candidates whose forwards take fixed times: deterministic, no model and no clock involved. The choice on the
real model is tested in test_engine.py."""

import re
from types import SimpleNamespace

import pytest
import torch

from samplechain.runtime import kernels as K
from samplechain.runtime.cpu_engine import EngineUnavailable

# name: (decode step ms, a BATCH-token forward's ms per 8 tokens); score = decode + that / 8
TIMES = {
    "c-fast": (10.0, 40.0),  # score 15, the fastest decode step: its score sets round 1's bar (1.5 x 15 = 22.5)
    "c-close": (11.0, 24.0),  # score 14: slower per step, faster per prompt token, so it wins
    "c-batchy": (12.0, 200.0),  # passes round 1 on its decode step, score 37 > 1.5 x 14: stops after two turns
    "c-slow": (30.0, 100.0),  # decode step over the bar: dropped after the quick round
    "c-avx2-q8": (5.0, 16.0),  # opt-in (score 7): timed on request, never sets the bar, never chosen
}
REFERENCE = torch.arange(16 * 4, dtype=torch.float32).reshape(16, 4)  # calibration logits of the 16-bit family
LOGITS = {"c-odd": REFERENCE + 2.0 ** -10, "c-avx2-q8": REFERENCE + 0.05 * REFERENCE.abs().max()}


def _unavailable(_t):
    raise EngineUnavailable("this CPU cannot run it")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Fake candidates on an empty cache: each builds to its name; its forwards take TIMES and are logged."""
    monkeypatch.setenv("SAMPLECHAIN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SAMPLECHAIN_KERNEL", raising=False)
    monkeypatch.setattr(K.cpu_engine, "library", lambda: None)
    calls = []

    def timer(name, _tokens):
        def run(n):
            calls.append((name, n))
            return TIMES[name][0] if n == 1 else TIMES[name][1] * n / 8
        return run

    table = {name: (lambda _t, name=name: name, True) for name in ("c-missing", "c-fast", "c-close", "c-batchy",
                                                                   "c-slow", "c-odd", "c-avx2-q8")}
    table["c-missing"] = (_unavailable, True)
    monkeypatch.setattr(K, "CPU_CANDIDATES", table)
    monkeypatch.setattr(K, "_forward_timer", timer)
    monkeypatch.setattr(K, "_logits", lambda name, tokens: LOGITS.get(name, REFERENCE)[:len(tokens)])
    return calls


def _model(form="Q4_0", arch="llama"):
    """A stand-in for a Transformer: what the choice reads (its matrices' shapes and kinds, device, vocabulary)."""
    def lin(rows, cols):
        return SimpleNamespace(shape=(rows, cols), form=form, has_q4=False)

    layer = SimpleNamespace(qkv=lin(96, 64), wo=lin(64, 64), gate_up=lin(256, 64), down=lin(64, 128))
    return SimpleNamespace(config=SimpleNamespace(arch=arch, n_layer=2, n_vocab=320), layers=[layer, layer],
                           output=lin(320, 64), device=torch.device("cpu"))


def _count(calls):
    """{name: (decode steps, BATCH-token forwards)} from the timer's log."""
    return {name: (calls.count((name, 1)), calls.count((name, K.BATCH))) for name in dict(calls)}


def test_quick_round_prunes_and_the_race_stops_when_decided(fake):
    assert (K.QUICK_STEPS, K.ROUNDS, K.PRUNE, K.BATCH) == (3, 5, 1.5, 32)
    trials = {r.name: r for r in K.measure(_model())}
    assert _count(fake) == {
        "c-fast": (3 + 5, 1 + 5),  # round 1's leader: its BATCH-token forward sets the bar; then all five turns
        "c-close": (3 + 5, 5),  # within 1.5x of c-fast: timed to the end
        "c-batchy": (3 + 2, 2),  # stops after the second turn of round 2
        "c-slow": (3, 0),  # never timed in round 2
    }
    assert trials["c-missing"].problem == "this CPU cannot run it" and trials["c-missing"].decode_ms is None
    assert trials["c-odd"].problem == "differs from the other compiled variants (error 1.40e-04)"
    assert trials["c-slow"].pruned and trials["c-slow"].decode_ms == 30.0 and trials["c-slow"].score is None
    assert [r.name for r in trials.values() if r.pruned] == ["c-slow"]
    assert trials["c-close"].score == 14.0 and trials["c-fast"].score == 15.0 and trials["c-batchy"].score == 37.0
    assert K.pick(list(trials.values())).name == "c-close"
    assert "c-avx2-q8" not in trials  # opt-in: measured only on request
    assert "(over 1.5x the best in the quick round)" in K.report(list(trials.values()), "c-close")


def test_a_lone_survivor_is_not_timed_further(fake, monkeypatch):
    monkeypatch.setitem(TIMES, "c-close", (40.0, 40.0))
    monkeypatch.setitem(TIMES, "c-batchy", (23.0, 8.0))  # just over the bar on its decode step alone
    trials = K.measure(_model())
    assert _count(fake) == {"c-fast": (3, 1), "c-close": (3, 0), "c-batchy": (3, 0), "c-slow": (3, 0)}
    assert K.pick(trials).name == "c-fast" and trials[0].name == "c-fast" and trials[0].score == 15.0


def test_opt_in_kernels_are_checked_and_timed_on_request_but_never_set_the_bar(fake):
    trials = {r.name: r for r in K.measure(_model(), opt_in=True)}
    q8 = trials["c-avx2-q8"]
    assert q8.error == pytest.approx(0.05) and q8.problem is None and q8.score == 7.0
    # with the bar set by the opt-in kernel (1.5 x 7) c-fast, c-close and c-batchy would have been pruned
    assert [r.name for r in trials.values() if r.pruned] == ["c-slow"]
    assert _count(fake)["c-avx2-q8"] == (3 + 5, 5)
    assert K.pick(list(trials.values())).name == "c-close"


def test_the_choice_is_shared_by_models_with_the_same_matrices(fake, capsys):
    """The cache key is the machine and the model's matrices (shapes, weight kinds, layers), not its file or
    architecture: a second model with the same matrices is not measured; one with other weight kinds is."""
    assert K.choose_kernel(_model()) == "c-close"
    line = capsys.readouterr().err
    assert re.fullmatch(r"measuring CPU kernels for this model \(once per machine\) \.\.\. c-close "
                        r"\(11\.0 ms/step; \d+\.\d s\)\n", line), line
    entry = K._read_cache()[K.cache_key(_model())]
    assert entry["kernel"] == "c-close" and entry["pruned"] == ["c-slow"] and entry["score"]["c-close"] == 14.0
    assert K.shape_key(_model()) == ("L2 qkv 96x64 Q4_0, wo 64x64 Q4_0, gate_up 256x64 Q4_0, down 64x128 Q4_0, "
                                     "output 320x64 Q4_0")
    fake.clear()
    assert K.choose_kernel(_model(arch="qwen2")) == "c-close"
    assert fake == [] and capsys.readouterr().err == ""  # reused, silently
    assert K.choose_kernel(_model(form="Q8_0")) == "c-close"
    assert fake and "measuring CPU kernels" in capsys.readouterr().err
    assert len(K._read_cache()) == 2


def test_a_failed_measurement_ends_its_line(fake, monkeypatch, capsys):
    monkeypatch.setattr(K, "CPU_CANDIDATES", {"c-missing": (_unavailable, True)})
    model = _model()
    model.dense = lambda: "c-missing-reference"
    with pytest.raises(EngineUnavailable, match="no CPU kernel candidate met the accuracy bound"):
        K.choose_kernel(model)
    assert capsys.readouterr().err == "measuring CPU kernels for this model (once per machine) ... failed\n"


def test_the_packaged_models_cache_key(smol):
    assert K.shape_key(smol.transformer) == (
        "L30 qkv 960x576 Q4_1, wo 576x576 Q4_1, gate_up 3072x576 Q4_1, down 576x1536 Q4_1, output 49152x576 Q8_0")


def test_cuda_graph_spans_cover_the_cells_in_use():
    """A decode graph attends over the first 256, 1024, 4096, ... cells, the smallest span that holds the cells in
    use, and never past the cache (its cells a multiple of 256, the spare cell last)."""
    from samplechain.runtime.cuda_graphs import span_of

    assert [span_of(n, 4352) for n in (1, 256, 257, 1024, 1025, 4096, 4097, 4351)] == [
        256, 256, 1024, 1024, 4096, 4096, 4352, 4352]
    assert [span_of(n, 512) for n in (1, 300, 511)] == [256, 512, 512]


def test_decode_steps_within_the_noise_are_decided_by_the_batch_forward():
    """Measured on a 2-vCPU Xeon (the 1B shape): c-avx512vnni's step 35.3 ms and its 32-token forward 270 ms, c-amx's
    36.0 and 167 ms. A c-amx step measured 9 % slower (38.6 ms) made the plain score pick c-avx512vnni (43.7 against
    43.8 ms) and lose 35-60 % on prompts; within 10 % the steps count as one speed and the forward decides. A step
    13 % slower still counts."""
    assert K.DECODE_TIE == 0.10
    amx = K.Trial("c-amx", decode_ms=38.6, invariant=True, batch_ms=167.0, score=38.6 + 167.0 / K.BATCH)
    vnni = K.Trial("c-avx512vnni", decode_ms=35.3, invariant=True, batch_ms=270.0, score=35.3 + 270.0 / K.BATCH)
    assert vnni.score < amx.score  # the plain score would pick c-avx512vnni
    assert K.pick([vnni, amx]).name == "c-amx"
    far = K.Trial("c-avx512vnni", decode_ms=34.0, invariant=True, batch_ms=196.0, score=34.0 + 196.0 / K.BATCH)
    assert far.decode_ms * 1.10 < amx.decode_ms and K.pick([far, amx]).name == "c-avx512vnni"
