"""The runtime on CUDA: generation through replayed CUDA graphs equals the eager path, with context shift, state
files and backend sampling. Skipped without CUDA (CI has no GPU); run on a GPU machine."""

import numpy as np
import pytest
import torch

from samplechain import SamplingParams
from samplechain.cli import main
from samplechain.runtime import Context, load_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
PROMPT = "The three most useful things to know about the ocean are"


@pytest.fixture(scope="module")
def cuda_model():
    return load_model(device="cuda", kernel="cuda-graph")


@pytest.fixture(scope="module")
def eager(cuda_model):
    return cuda_model.transformer.with_engine(None, "cuda-eager")


def test_cuda_logits_match_the_cpu_reference(cuda_model, smol, dense_of):
    tokens = smol.tokenize(PROMPT)
    n = len(tokens)
    got = Context(cuda_model.transformer, 128).decode(tokens, outputs=[True] * n).cpu()
    want = Context(dense_of(smol), 128).decode(tokens, outputs=[True] * n)
    assert (got - want).abs().max().item() < 2e-3


@pytest.mark.parametrize("batch", [1, 3, 17])
def test_graph_steps_equal_eager_steps(cuda_model, eager, batch):
    """Decode steps of `batch` sequences (padded to a bucket) replayed from graphs: the eager logits."""
    tokens = list(np.resize(cuda_model.tokenize(PROMPT), 40))
    outs = []
    for t in (cuda_model.transformer, eager):
        ctx = Context(t, 512, n_seq_max=batch)
        for s in range(batch):
            ctx.decode(tokens[: 4 + s], seq_ids=[s] * (4 + s), outputs=[False] * (3 + s) + [True])
        steps = []
        for i in range(6):
            toks = [tokens[(i + s) % len(tokens)] for s in range(batch)]
            pos = [ctx.seq_pos_max(s) + 1 for s in range(batch)]
            steps.append(ctx.decode(toks, positions=pos, seq_ids=list(range(batch)), outputs=[True] * batch).cpu())
        outs.append(torch.stack(steps))
    assert (outs[0] - outs[1]).abs().max().item() < 1e-3


def test_greedy_generation_equals_eager(cuda_model, eager):
    params = SamplingParams(temperature=0.0)
    graph_text = "".join(cuda_model.generate(PROMPT, params, n_predict=48))
    cuda_model.transformer, saved = eager, cuda_model.transformer
    try:
        eager_text = "".join(cuda_model.generate(PROMPT, params, n_predict=48))
    finally:
        cuda_model.transformer = saved
    assert graph_text == eager_text and len(graph_text) > 40


def test_context_shift_on_cuda(cuda_model):
    text = "".join(cuda_model.generate(PROMPT, SamplingParams(seed=3), n_predict=80, n_ctx=48))
    assert cuda_model.context_shifts >= 1 and len(text) > 100


def test_state_file_round_trip_on_cuda(cuda_model, tmp_path):
    path = tmp_path / "cache.bin"

    def run():
        return "".join(cuda_model.generate(PROMPT, SamplingParams(seed=11), n_predict=24, n_ctx=128,
                                           prompt_cache=path))

    first, second = run(), run()
    assert cuda_model.timings.n_reused > 0 and first == second


@pytest.mark.parametrize("mode", [dict(backend_sampling=True), dict(backend_sampling=True, backend_dist=True)])
def test_backend_sampling_on_cuda(cuda_model, mode):
    params = dict(seed=9, temperature=1.1, top_p=0.9)
    want = "".join(cuda_model.generate(PROMPT, SamplingParams(**params), n_predict=24))
    got = "".join(cuda_model.generate(PROMPT, SamplingParams(**params, **mode), n_predict=24))
    assert got == want


def test_cli_device_cuda(capsys):
    assert main(["generate", "-p", PROMPT, "-n", "8", "-s", "1", "--device", "cuda"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out) > 8 and "kernel = cuda-" in captured.err


def test_positions_beyond_the_graph_buckets_run_eagerly(cuda_model, eager):
    tokens = np.resize(cuda_model.tokenize(PROMPT), 150)
    a = Context(cuda_model.transformer, 256).decode(tokens).cpu()
    b = Context(eager, 256).decode(tokens).cpu()
    assert torch.equal(a, b)


def test_tf32_graphs_stay_within_the_accuracy_bound(cuda_model, eager):
    from samplechain.runtime.kernels import ACCURACY_BOUND, build_candidate

    tf32 = build_candidate(eager, "cuda-graph-tf32")
    tokens = cuda_model.tokenize(PROMPT)
    ctx_a, ctx_b = Context(tf32, 128), Context(eager, 128)
    ctx_a.decode(tokens[:-1], outputs=[False] * (len(tokens) - 1))
    ctx_b.decode(tokens[:-1], outputs=[False] * (len(tokens) - 1))
    a = ctx_a.decode(tokens[-1:]).cpu()
    b = ctx_b.decode(tokens[-1:]).cpu()
    assert (a - b).abs().max().item() < 0.1 * ACCURACY_BOUND * b.abs().max().item()
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    assert not torch.backends.cuda.matmul.allow_tf32  # the process-wide setting is left as it was
