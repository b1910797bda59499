"""The compiled engine's worker pool: the same bits from any calling thread, from two threads decoding at once, and
for any thread count; one pool per process whatever thread calls."""

import threading

import pytest
import torch

from samplechain.runtime import Context
from samplechain.runtime.cpu_engine import library

PROMPT = "The history of the ocean is the history of the planet, and"
OTHER = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)"


def _logits(t, tokens, n_prompt=8):
    """A prompt batch (every row an output: quantize, attention and matmuls run in parallel), then one token at a
    time; every logits row, stacked."""
    ctx = Context(t, 128)
    rows = [ctx.decode(tokens[:n_prompt], outputs=[True] * n_prompt)]
    rows += [ctx.decode([tok]) for tok in tokens[n_prompt:]]
    return torch.cat(rows)


def _in_thread(fn):
    out: list = []

    def run():
        try:
            out.append(fn())
        except BaseException as e:  # surfaced in the calling thread
            out.append(e)

    th = threading.Thread(target=run)
    th.start()
    th.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


@pytest.fixture
def threads():
    """Restores torch's thread count (the engine's `nt`) after a test changes it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model(smol):
    assert smol.transformer.kernel.startswith("c-")
    return smol, smol.transformer, smol.tokenize(PROMPT)[:14]


def test_decode_from_another_thread_gives_the_same_bits(model, threads):
    _, t, tokens = model
    torch.set_num_threads(2)
    main = _logits(t, tokens)
    workers = library().sc_pool_workers()
    assert workers >= 1  # the main thread's decode started the pool
    other = _in_thread(lambda: _logits(t, tokens))
    assert torch.equal(other, main)
    assert torch.equal(_logits(t, tokens), main)  # and the main thread's again, after the other thread's
    assert library().sc_pool_workers() == workers  # the other thread used the same pool: no second team


def test_concurrent_decodes_keep_their_bits(model, threads):
    """Two threads decode at once, each on its own context of the same model, many times over (the engine's calls
    release the GIL): each gets the bits it gets alone."""
    smol, t, tokens = model
    torch.set_num_threads(2)
    other_tokens = smol.tokenize(OTHER)[:14]
    alone = [_logits(t, tokens), _logits(t, other_tokens)]
    start = threading.Barrier(2)
    results: list[list] = [[], []]

    def run(i):
        start.wait()
        for _ in range(6):
            results[i].append(_logits(t, [tokens, other_tokens][i]))

    def guarded(i):
        try:
            run(i)
        except BaseException as e:
            results[i].append(e)

    pair = [threading.Thread(target=guarded, args=(i,)) for i in range(2)]
    for th in pair:
        th.start()
    for th in pair:
        th.join()
    for i in range(2):
        assert len(results[i]) == 6
        for got in results[i]:
            assert not isinstance(got, BaseException), got
            assert torch.equal(got, alone[i])


def test_thread_counts_give_the_same_bits(model, threads):
    _, t, tokens = model
    results = {}
    for nt in (1, 2, 3):  # 3: more threads than this machine may have; the pool grows
        torch.set_num_threads(nt)
        results[nt] = _logits(t, tokens)
    assert library().sc_pool_workers() >= 2
    assert torch.equal(results[2], results[1])
    assert torch.equal(results[3], results[1])
    torch.set_num_threads(2)  # back to fewer threads than the pool has
    assert torch.equal(_logits(t, tokens), results[1])
