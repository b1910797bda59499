"""The compiled fused step (``csrc/sampling.c``, ``samplechain._native``) gives bitwise what the NumPy step gives:
the same tokens, the same generator afterwards, the same candidates and probabilities, the same errors.

Each case runs the same chain twice, once with the compiled step and once on NumPy alone (``set_sampling(None)``),
over many tokens: the generator's buffered words run out every 312 draws, which takes the other branch of the draw.
"""

import numpy as np
import pytest
from tests.test_fused_chain import KINDS, adversarial, bits, default_chain, realistic

from samplechain import (
    Chain,
    CommonSampler,
    Dist,
    DynamicTemperature,
    Greedy,
    MinP,
    SamplingParams,
    Temperature,
    TopK,
    TopP,
    _native,
)

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                        "ignore:invalid value encountered:RuntimeWarning")
F32 = np.float32

NATIVE = _native.sampling()
needs_native = pytest.mark.skipif(NATIVE is None, reason="no C compiler or Python headers: NumPy only here")


@pytest.fixture
def numpy_only():
    """Run the body's chains on NumPy alone; chains built before the switch keep what they found."""
    previous = _native.set_sampling(None)
    yield
    _native.set_sampling(previous)


def run_both(make, xs, steps):
    """Tokens (or the error) of ``Chain(make()).sample`` over ``xs`` with the compiled step, then on NumPy alone,
    and each chain's next generator words afterwards."""
    out = []
    for module in (NATIVE, None):
        previous = _native.set_sampling(module)
        try:
            chain = Chain(make())
            tokens = []
            try:
                for i in range(steps):
                    tokens.append(chain.sample(xs[i % len(xs)]))
            except ValueError as e:
                tokens.append(str(e))
            words = [s.rng.next_u32() for s in chain if hasattr(s, "rng")]
        finally:
            _native.set_sampling(previous)
        out.append((tokens, words))
    return out


CHAINS = {
    "default": lambda: default_chain(7),
    "top-k + dist": lambda: [TopK(40), Dist(7)],
    "top-k + top-p + dist": lambda: [TopK(50), TopP(0.9, 3), Dist(7)],
    "top-k + min-p + temp + dist": lambda: [TopK(100), MinP(0.1, 2), Temperature(0.7), Dist(7)],
    "top-k 1 + temp + dist": lambda: [TopK(1), Temperature(0.5), Dist(7)],
    "temp above 1": lambda: [TopK(40), TopP(0.95), Temperature(1.7), Dist(7)],
    "temp 0 (greedy masking)": lambda: [TopK(40), Temperature(0.0), Dist(7)],
    "dynamic temperature": lambda: [TopK(40), DynamicTemperature(0.8, 0.3, 1.0), Dist(7)],
    "temp-ext without range": lambda: [TopK(40), TopP(0.95), DynamicTemperature(0.8, 0.0, 1.0), Dist(7)],
    "min-p above 1": lambda: [TopK(40), MinP(1.5, 3), Dist(7)],
    "top-k 2048": lambda: [TopK(2048), TopP(0.99), Dist(7)],
    "top-k 3000": lambda: [TopK(3000), TopP(0.99), Dist(7)],
    "greedy": lambda: [Greedy()],
    # no top-k: min-p over the full vocabulary, in vocabulary order
    "min-p + temp + dist": lambda: [MinP(0.05), Temperature(0.8), Dist(7)],
    "min-p + dist, min_keep": lambda: [MinP(0.2, 3), Dist(7)],
    "min-p wide + temp above 1": lambda: [MinP(0.001), Temperature(1.5), Dist(7)],
    "min-p + temp 0": lambda: [MinP(0.05), Temperature(0.0), Dist(7)],
    "top-p + min-p (sorts: NumPy)": lambda: [TopP(0.9), MinP(0.05), Dist(7)],
}


@needs_native
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 5, 300, 4096, 49152, 262147])
@pytest.mark.parametrize("name", list(CHAINS))
def test_compiled_step_equals_numpy(name, n, kind):
    xs = [adversarial(kind, n, seed) for seed in range(3)]
    steps = 320 if n <= 4096 and kind in ("realistic", "ties") else 12  # past a refill of the words, at least once
    native, numpy = run_both(CHAINS[name], xs, steps)
    assert native == numpy


@needs_native
def test_compiled_step_runs_for_the_default_chain_and_greedy():
    """The fast path is taken (not silently left to NumPy): the step returns a token for realistic logits."""
    x = realistic(49152, 0)
    chain = Chain(default_chain(3))
    chain.sample(x)
    assert chain._whole is not None and chain._whole.sample(x, None) >= 0
    min_p = Chain([MinP(0.05), Temperature(0.8), Dist(3)])
    min_p.sample(x)
    assert min_p._whole is not None and min_p._whole.sample(x, None) >= 0
    greedy = Chain([Greedy()])
    assert greedy.sample(x) == int(np.argmax(x))
    assert greedy._whole.sample(x, None) == int(np.argmax(x))


@needs_native
def test_exact_tokens():
    """Fixed inputs and seeds, fixed tokens, on both paths."""
    x = realistic(49152, 11)
    expected = {
        "default": [1357, 1357, 1357, 1357, 34125, 1357, 1357, 1357],
        "hot": [47079, 2561, 7202, 34126, 15307, 1357, 34125, 2561],
    }
    makes = {"default": lambda: default_chain(1234),
             "hot": lambda: [TopK(40), TopP(0.99), MinP(0.001), Temperature(3.0), Dist(1234)]}
    for name, make in makes.items():
        native, numpy = run_both(make, [x], 8)
        assert native[0] == numpy[0] == expected[name]


@needs_native
@pytest.mark.parametrize("n", [300, 49152])
@pytest.mark.parametrize("top_k", [30, 0])
def test_common_sampler_candidates_equal_numpy(n, top_k):
    """``CommonSampler`` takes the compiled step too; the candidates it records (ids, logits, probabilities,
    selection, sorted or in vocabulary order) are bitwise the NumPy step's."""
    params = SamplingParams(seed=5, top_k=top_k, top_p=0.9 if top_k else 1.0, min_p=0.02, temperature=0.6)
    rows = [realistic(n, seed) for seed in range(4)]
    seen = []
    for module in (NATIVE, None):
        previous = _native.set_sampling(module)
        try:
            sampler = CommonSampler(params)
            steps = []
            for i in range(40):
                token = sampler.sample(rows[i % 4])
                c = sampler.candidates
                steps.append((token, c.ids.tolist(), bits(c.logits), bits(c.probs), c.selected, c.sorted,
                              sampler.top_probs(3)))
            seen.append(steps)
        finally:
            _native.set_sampling(previous)
    assert seen[0] == seen[1]


@needs_native
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_and_inf_raise_as_before(bad):
    x = realistic(49152, 1)
    x[12345] = bad
    errors = []
    for module in (NATIVE, None):
        previous = _native.set_sampling(module)
        try:
            chain = Chain(default_chain(1))
            with pytest.raises(ValueError) as e:
                chain.sample(x)
            errors.append((str(e.value), chain[-1].rng.next_u32()))
        finally:
            _native.set_sampling(previous)
    assert errors[0] == errors[1]
    assert "must not contain" in errors[0][0]


@needs_native
def test_other_inputs_take_the_numpy_step():
    """float64 logits, a list, a strided view: the step declines (-2) and the NumPy step converts them."""
    x = realistic(4096, 2)
    for logits in (x.astype(np.float64), x.tolist(), np.repeat(x, 2)[::2], x.astype(x.dtype.newbyteorder())):
        native, numpy = run_both(lambda: [TopK(40), TopP(0.9), Dist(3)], [logits], 4)
        assert native == numpy
    chain = Chain([TopK(40), Dist(3)])
    chain.sample(x)
    assert chain._whole.sample(x.astype(np.float64), None) == -2


@needs_native
def test_changed_parameters_take_effect():
    """Assigning a member's parameter between tokens: the cached parameters are remade."""
    x = realistic(49152, 4)
    out = []
    for module in (NATIVE, None):
        previous = _native.set_sampling(module)
        try:
            chain = Chain([TopK(40), TopP(0.95), Temperature(0.8), Dist(9)])
            tokens = [chain.sample(x) for _ in range(3)]
            chain[0].k = 2
            tokens += [chain.sample(x) for _ in range(3)]
            chain[2].t = F32(1.5)
            chain[1].p = F32(0.5)
            tokens += [chain.sample(x) for _ in range(3)]
            out.append(tokens)
        finally:
            _native.set_sampling(previous)
    assert out[0] == out[1]
    assert set(out[0][3:6]) <= set(np.argsort(-x, kind="stable")[:2].tolist())


def test_numpy_only_when_asked(monkeypatch, numpy_only):
    monkeypatch.setenv("SAMPLECHAIN_NATIVE", "0")
    assert _native._load_sampling() is None
    chain = Chain(default_chain(1))
    assert chain.sample(realistic(300, 0)) >= 0


def test_first_max_keeps_the_first_of_equal_logits():
    if NATIVE is None:
        pytest.skip("no compiled step here")
    x = np.zeros(10000, dtype=F32)
    x[[17, 4000, 9999]] = 2.0
    assert NATIVE.first_max(x) == 17
    y = np.full(70000, -np.inf, dtype=F32)
    y[[5, 69999]] = F32(-0.0)
    y[6] = 0.0
    assert NATIVE.first_max(y) == 5
    z = np.full(3, -np.inf, dtype=F32)
    assert NATIVE.first_max(z) == 0
    z[1] = np.nan
    assert NATIVE.first_max(z) == -1


@needs_native
@pytest.mark.parametrize("big", [2**31 - 1, 2**31, 2**32 + 1, 2**63, 2**70])
def test_counts_past_c_ints_act_as_in_numpy(big):
    """k and min_keep have no upper bound: the compiled step clamps them to counts with the same effect."""
    x = realistic(4096, 5)
    for make in (lambda: [TopK(40), TopP(0.5, big), Dist(1)], lambda: [TopK(40), MinP(0.5, big), Dist(1)],
                 lambda: [TopK(big), Dist(1)], lambda: [TopK(3000), TopP(0.9, 0), MinP(0.1, 0), Dist(1)]):
        native, numpy = run_both(make, [x], 6)
        assert native == numpy


@needs_native
def test_threads_with_small_stacks():
    """The step's working arrays are not on the stack: a 64 KiB thread stack is enough (musl's default: 128 KiB)."""
    import threading

    x = realistic(262144, 6)
    got = []
    old = threading.stack_size(64 * 1024)
    try:
        t = threading.Thread(target=lambda: got.append(Chain(default_chain(2)).sample(x)))
        t.start()
        t.join()
    finally:
        threading.stack_size(old)
    assert got == [Chain(default_chain(2)).sample(x)]
