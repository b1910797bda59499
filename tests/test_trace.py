"""Traces (samplechain.trace): each stage's candidates, and a trace selects exactly what sample() selects."""

import numpy as np
import pytest

from samplechain import CommonSampler, SamplingParams
from samplechain._numeric import logf
from samplechain.trace import LOGITS_ABOUT, NEIGHBOURS, TraceContext, _ranked, format_trace, trace, trace_step

F32 = np.float32


def softmax32(x):
    e = np.exp(np.asarray(x, dtype=np.float64) - max(x))
    return [float(F32(v)) for v in e / e.sum()]


def entropy(p):
    q = np.asarray(p, dtype=F32).astype(np.float64)
    return float(-(q * np.log(q)).sum())


def top_p_sums(x):
    """top-p's running sums over descending logits x: binary32 expf, a binary32 total, binary32 running sums."""
    x = np.asarray(x, dtype=F32)
    e = np.exp((x - x[0]).astype(np.float64)).astype(F32)
    total = F32(0.0)
    for v in e:
        total = F32(total + v)
    run, out = F32(0.0), []
    for v in e / total:
        run = F32(run + v)
        out.append(float(run))
    return out


# --- stages on hand-computable logits ------------------------------------------------------------------------


def test_trace_step_stages_of_top_k_then_dist():
    params = SamplingParams(samplers=("top_k",), top_k=2, seed=3)
    sampler = CommonSampler(params, n_vocab=4)
    step = trace_step(sampler, np.array([1.0, 3.0, 2.0, 0.0], dtype=F32), n_top=3)
    assert [s.name for s in step.stages] == ["logits", "top-k", "dist"]
    logits, top_k, dist = step.stages
    assert (logits.size, logits.effect, logits.params, logits.selected) == (4, None, {}, None)
    assert [(r.id, r.logit, r.rank) for r in logits.top] == [(1, 3.0, 0), (2, 2.0, 1), (0, 1.0, 2)]
    p = softmax32([1.0, 3.0, 2.0, 0.0])
    assert [r.prob for r in logits.top] == [p[1], p[2], p[0]]
    assert (top_k.size, top_k.effect, top_k.params, top_k.selected) == (2, "filter", {"k": 2}, None)
    assert [(r.id, r.logit, r.prob) for r in top_k.top] == [(1, 3.0, softmax32([3.0, 2.0])[0]),
                                                           (2, 2.0, softmax32([3.0, 2.0])[1])]
    assert dist.size == 2 and dist.effect == "selector" and dist.params == {"seed": 3}
    assert dist.selected == step.token and step.token in (1, 2)
    assert step.rejected is None and step.piece is None
    # the selected token as every stage left it
    assert [s.chosen.id for s in step.stages] == [step.token] * 3


# penalties -> top-k -> top-p -> min-p -> temperature on six hand-computable logits, tokens 1 and 2 in the history
CUT_LOGITS = [1.0, 3.0, 2.0, 0.0, 2.5, -1.0]
CUT_PARAMS = SamplingParams(samplers=("penalties", "top_k", "top_p", "min_p", "temperature"), repeat_penalty=1.5,
                            top_k=4, top_p=0.8, min_p=0.4, temperature=0.5, seed=3)


def cut_step(n_top=3):
    sampler = CommonSampler(CUT_PARAMS, n_vocab=6)
    for t in (1, 2):
        sampler.accept(t)
    return trace_step(sampler, np.array(CUT_LOGITS, dtype=F32), n_top=n_top)


def test_each_stage_says_what_it_removed_or_changed():
    step = cut_step()
    assert [s.name for s in step.stages] == ["logits", "penalties", "top-k", "top-p", "min-p", "temp-ext", "dist"]
    assert [(s.n_before, s.removed, s.changed) for s in step.stages] == [
        (6, 0, 0), (6, 0, 2), (6, 2, 0), (4, 1, 0), (3, 1, 0), (2, 0, 2), (2, 0, 0)]
    assert [s.scale for s in step.stages] == ["logit", "logit", "logit", "prob", "prob", "prob", "prob"]
    assert [s.about for s in step.stages] == [
        LOGITS_ABOUT,
        "llama.cpp's penalties: repeat (divide positive / multiply negative logits), frequency, presence.",
        "Keeps the k largest logits, sorted descending; k <= 0 is a no-op.",
        "Nucleus sampling: the smallest descending prefix whose probability mass reaches p.",
        "Keeps candidates whose probability is at least p times the largest one.",
        "llama.cpp's temp_ext: temperature in [t - delta, t + delta] chosen by normalised entropy.",
        "Draws a token from the softmax of the logits, exactly as llama.cpp's dist sampler (one double per draw).",
    ]
    assert all(s.cut == {} for s in (step.stages[0], step.stages[1], step.stages[6]))
    # penalties: 3 -> 3 / 1.5 and 2 -> 2 / 1.5 (binary32), shown before -> after with their input ranks
    logits, penalties = step.stages[:2]
    assert [(r.id, r.rank, r.logit_before, r.logit, r.kept) for r in penalties.rows] == [
        (1, 0, 3.0, 2.0, True), (4, 1, 2.5, 2.5, True), (2, 2, 2.0, float(F32(2.0) / F32(1.5)), True)]
    assert [r.prob_before for r in penalties.rows] == [r.prob for r in logits.top]
    assert [r.prob for r in penalties.rows] == [softmax32([1.0, 2.0, F32(2.0) / F32(1.5), 0.0, 2.5, -1.0])[i]
                                                for i in (1, 4, 2)]


def test_top_k_marks_its_kth_candidate_and_the_cut_neighbourhood():
    top_k = cut_step().stages[2]
    x = [1.0, 2.0, float(F32(2.0) / F32(1.5)), 0.0, 2.5, -1.0]  # after the penalties
    assert top_k.cut == {"kind": "top-k", "k": 4, "kth_rank": 3, "kth_id": 0, "kth_logit": 1.0}
    # the top 3 and the ranks [4 - 3, 4 + 3) of the cut's neighbourhood, removed ones with no logit after
    kept = softmax32([*x[:3], 2.5])  # ids 0, 1, 2, 4
    assert [(r.id, r.rank, r.logit_before, r.logit, r.prob, r.kept) for r in top_k.rows] == [
        (4, 0, 2.5, 2.5, kept[3], True),
        (1, 1, 2.0, 2.0, kept[1], True),
        (2, 2, x[2], x[2], kept[2], True),
        (0, 3, 1.0, 1.0, kept[0], True),
        (3, 4, 0.0, None, 0.0, False),
        (5, 5, -1.0, None, 0.0, False)]
    assert [r.prob_before for r in top_k.rows] == [softmax32(x)[i] for i in (4, 1, 2, 0, 3, 5)]


def test_top_p_gives_its_running_sums_and_threshold():
    top_p = cut_step().stages[3]
    run = top_p_sums([2.5, 2.0, F32(2.0) / F32(1.5), 1.0])
    assert run[1] < F32(0.8) <= run[2]  # the third candidate reaches p
    assert top_p.cut == {"kind": "top-p", "p": float(F32(0.8)), "min_keep": 0, "kept": 3, "cum_kept": run[2],
                         "cum_before_last": run[1]}
    assert [(r.id, r.rank, r.kept, r.cum) for r in top_p.rows] == [
        (4, 0, True, run[0]), (1, 1, True, run[1]), (2, 2, True, run[2]), (0, 3, False, run[3])]
    assert top_p.rows[3].to_dict()["cum"] == run[3] and "cum" not in cut_step().stages[2].rows[0].to_dict()


def test_min_p_gives_its_threshold_relative_to_the_top_candidate():
    min_p = cut_step().stages[4]
    x = [2.5, 2.0, float(F32(2.0) / F32(1.5))]
    top = softmax32(x)[0]
    assert min_p.cut == {"kind": "min-p", "p": float(F32(0.4)), "top_id": 4, "top_prob": top, "top_logit": 2.5,
                         "threshold_logit": float(F32(2.5) + logf(F32(0.4))), "threshold_prob": top * float(F32(0.4))}
    assert x[1] >= min_p.cut["threshold_logit"] > x[2]
    assert [(r.id, r.kept, r.prob_before) for r in min_p.rows] == [
        (4, True, top), (1, True, softmax32(x)[1]), (2, False, softmax32(x)[2])]


def test_temperature_gives_the_shape_before_and_after():
    temp = cut_step().stages[5]
    assert temp.cut == {"kind": "temperature", "t": 0.5, "delta": 0.0, "entropy_before": entropy(softmax32([2.5, 2.0])),
                        "entropy_after": entropy(softmax32([5.0, 4.0]))}
    assert temp.cut["entropy_after"] < temp.cut["entropy_before"]
    assert [(r.id, r.logit_before, r.logit, r.prob_before, r.prob) for r in temp.rows] == [
        (4, 2.5, 5.0, softmax32([2.5, 2.0])[0], softmax32([5.0, 4.0])[0]),
        (1, 2.0, 4.0, softmax32([2.5, 2.0])[1], softmax32([5.0, 4.0])[1])]


def test_stage_rows_are_bounded_and_in_input_order():
    step = cut_step(n_top=1)
    assert step.token == 4  # rank 1 of the logits, rank 0 from the penalties on
    # the input's top 1, the cut's neighbourhood (top-k: ranks [1, 7), top-p: [0, 6), min-p: [0, 5), clipped to
    # the input), the n_top changed candidates with the largest logits after (penalties: token 1), the selected one
    assert [[r.rank for r in s.rows] for s in step.stages] == [
        [0, 1], [0, 1], [0, 1, 2, 3, 4, 5], [0, 1, 2, 3], [0, 1, 2], [0], [0]]


def test_ranked_is_the_stable_descending_order():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 50, 5000).astype(F32)  # many ties
    x[rng.integers(0, 5000, 100)] = -np.inf
    order = np.argsort(-x, kind="stable")
    for lo, hi in ((0, 10), (37, 80), (0, 1), (4990, 5000), (120, 5000), (300, 300)):
        assert list(_ranked(x, lo, hi)) == list(order[lo:hi])


def test_trace_step_counts_masked_candidates_and_keeps_them_out_of_the_top():
    params = SamplingParams(samplers=(), logit_bias=((0, float("-inf")), (3, 1.5)), seed=1)
    step = trace_step(CommonSampler(params, n_vocab=4), [2.0, 1.0, 0.5, 0.0], n_top=10)
    assert [s.name for s in step.stages] == ["logits", "logit-bias", "dist"]
    bias = step.stages[1]
    assert (bias.size, bias.n_masked) == (4, 1)
    assert [(r.id, r.logit) for r in bias.top] == [(3, 1.5), (1, 1.0), (2, 0.5)]
    assert [r.prob for r in bias.top] == softmax32([1.5, 1.0, 0.5])
    assert step.token != 0


def test_chosen_rank_when_the_selected_token_is_outside_the_top():
    # greedy masking by temperature 0 keeps only the argmax: it is rank 0 everywhere it survives
    params = SamplingParams(samplers=("temperature",), temperature=0.0, seed=1)
    x = np.array([0.5, 4.0, 1.0, 2.0], dtype=F32)
    step = trace_step(CommonSampler(params, n_vocab=4), x, n_top=1)
    assert step.token == 1
    assert [s.chosen.rank for s in step.stages] == [0, 0, 0]
    temp = step.stages[1]
    assert temp.n_masked == 3 and [r.id for r in temp.top] == [1] and temp.top[0].prob == 1.0


def test_trace_step_leaves_the_logits_alone():
    x = np.array([1.0, 3.0, 2.0, 0.0], dtype=F32)
    before = x.copy()
    trace_step(CommonSampler(SamplingParams(seed=5), n_vocab=4), x)
    assert np.array_equal(x, before)


def test_bad_n_top():
    with pytest.raises(ValueError, match="n_top"):
        trace_step(CommonSampler(SamplingParams(seed=5), n_vocab=4), [1.0, 2.0], n_top=0)


# --- the trace selects what sample() selects -----------------------------------------------------------------


CHAINS = {
    "defaults": dict(seed=7),
    "top-k 3, temp 0.5": dict(top_k=3, temperature=0.5, seed=11),
    "greedy by temp 0": dict(temperature=0.0, seed=1),
    "every sampler": dict(samplers=("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                                    "temperature"),
                          repeat_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.1, dry_multiplier=0.8,
                          top_n_sigma=2.0, top_k=200, typical_p=0.95, top_p=0.9, min_p=0.02, xtc_probability=0.5,
                          xtc_threshold=0.05, temperature=1.2, dynatemp_range=0.3, seed=5),
    "logit bias and ignore_eos": dict(logit_bias=((42, 5.0), ("ocean", 3.0)), ignore_eos=True, seed=9),
    "mirostat 1": dict(mirostat=1, mirostat_tau=4.0, seed=13),
    "mirostat 2": dict(mirostat=2, mirostat_tau=3.0, seed=17),
    "adaptive-p": dict(samplers=("top_k", "adaptive_p"), top_k=50, adaptive_target=0.3, seed=19),
    "dist only": dict(samplers=(), seed=23),
    "grammar (rejection)": dict(grammar='root ::= [0-9]+ " apples"', seed=29),
}


@pytest.mark.parametrize("name", list(CHAINS))
def test_trace_step_selects_what_sample_selects(smol, name):
    params = SamplingParams(**CHAINS[name])
    vocab, n_vocab = smol.vocab, smol.config.n_vocab
    a = CommonSampler(params, vocab)
    b = CommonSampler(params, vocab)
    history = smol.tokenize("The ocean is deep and the ocean is wide")
    for t in history:
        a.accept(t)
        b.accept(t)
    rng = np.random.default_rng(len(name))
    rejected = 0
    for _ in range(12):
        logits = (rng.standard_normal(n_vocab) * 3.0).astype(F32)
        token = a.sample(logits)
        step = trace_step(b, logits, n_top=5)
        assert step.token == token
        assert step.stages[-1].selected == token
        rejected += step.rejected is not None
        # the same candidates and probabilities afterwards, and the same state
        assert np.array_equal(a.candidates.ids, b.candidates.ids)
        assert np.array_equal(a.candidates.probs, b.candidates.probs)
        assert list(a.prev) == list(b.prev)
        for before, stage in zip(step.stages, step.stages[1:], strict=False):
            assert stage.n_before == before.size - before.n_masked
            assert stage.removed == stage.n_before - (stage.size - stage.n_masked)
            ranks = [r.rank for r in stage.rows]
            assert ranks == sorted(set(ranks)) and len(ranks) <= 5 + 2 * NEIGHBOURS + 5 + 1
            assert sum(not r.kept for r in stage.rows) <= stage.removed
    if name.startswith("grammar"):
        assert rejected > 0  # random logits rarely start with a digit: the rejection path ran
        assert a.grammar is not None and b.grammar is not None


def test_trace_stage_names_follow_the_chain(smol):
    vocab = smol.vocab
    names = {}
    for name in ("defaults", "every sampler", "logit bias and ignore_eos", "mirostat 1", "mirostat 2", "adaptive-p"):
        sampler = CommonSampler(SamplingParams(**CHAINS[name]), vocab)
        step = trace_step(sampler, np.zeros(smol.config.n_vocab, dtype=F32) + np.arange(smol.config.n_vocab) * 1e-4)
        names[name] = [s.name for s in step.stages]
        assert [s.piece for s in step.stages[0].top] == [
            vocab.token_bytes(t).decode("utf-8", "replace") for t in (s.id for s in step.stages[0].top)]
    assert names == {
        "defaults": ["logits", "top-k", "top-p", "min-p", "temp-ext", "dist"],
        "every sampler": ["logits", "penalties", "dry", "top-n-sigma", "top-k", "typical", "top-p", "min-p", "xtc",
                          "temp-ext", "dist"],
        "logit bias and ignore_eos": ["logits", "logit-bias", "top-k", "top-p", "min-p", "temp-ext", "dist"],
        "mirostat 1": ["logits", "temp", "mirostat"],
        "mirostat 2": ["logits", "temp", "mirostat-v2"],
        "adaptive-p": ["logits", "top-k", "adaptive-p"],
    }


def test_grammar_first_trace_shows_the_grammar_stage(smol):
    params = SamplingParams(grammar='root ::= [0-9]+ " apples"', seed=29)
    a, b = CommonSampler(params, smol.vocab), CommonSampler(params, smol.vocab)
    logits = (np.random.default_rng(0).standard_normal(smol.config.n_vocab) * 3.0).astype(F32)
    step = trace_step(b, logits, grammar_first=True)
    assert step.token == a.sample(logits, grammar_first=True)
    assert [s.name for s in step.stages] == ["logits", "grammar", "top-k", "top-p", "min-p", "temp-ext", "dist"]
    assert step.stages[1].effect == "filter" and step.rejected is None
    assert smol.vocab.token_bytes(step.token).decode().isdigit()


# --- several steps on the model ------------------------------------------------------------------------------


def test_trace_steps_are_the_generated_tokens(smol):
    params = SamplingParams(seed=42, temperature=0.9)
    prompt = "The three most useful things to know about the ocean are"
    generated = []
    smol.on_token = lambda token, sampler: generated.append(token)
    try:
        list(smol.generate(prompt, params, n_predict=6, n_ctx=64))
    finally:
        smol.on_token = None
    t = trace(smol, smol.tokenize(prompt), params, n_top=3, steps=6)
    assert t.tokens == generated
    assert t.n_prompt_tokens == 11 and not t.stopped
    assert t.chain == "logits -> top-k -> top-p -> min-p -> temp-ext -> dist"
    assert [len(s.stages) for s in t.steps] == [6] * 6
    assert all(len(stage.top) <= 3 for s in t.steps for stage in s.stages)


def test_trace_of_the_last_step_only_is_the_same_stream(smol):
    params = SamplingParams(seed=5, mirostat=2)  # mirostat's state carries over from step to step
    tokens = smol.tokenize("Once upon a time")
    full = trace(smol, tokens, params, n_top=3, steps=4)
    last = trace(smol, tokens, params, n_top=3, steps=4, last_only=True)
    assert last.tokens == full.tokens
    assert [s.stages for s in last.steps[:3]] == [[], [], []]
    assert [s.piece for s in last.steps] == [s.piece for s in full.steps]
    assert last.steps[3].to_dict() == full.steps[3].to_dict()


def test_trace_context_reuses_its_prefix_exactly(smol):
    params = SamplingParams(seed=3)
    tokens = smol.tokenize("Once upon a time")
    ctx = TraceContext(smol, 64)
    first = trace(smol, tokens, params, steps=3, context=ctx)
    assert ctx.cached == tokens + first.tokens[:2]
    again = trace(smol, tokens, params, steps=3, context=ctx)  # the prompt comes from the cache
    fresh = trace(smol, tokens, params, steps=3)
    assert again.to_dict() == first.to_dict() == fresh.to_dict()
    # generated tokens are history: the trace goes on from them
    later = trace(smol, tokens, params, steps=1, generated=first.tokens[:2], context=ctx)
    assert later.n_prompt_tokens == len(tokens)
    as_prompt = trace(smol, tokens + first.tokens[:2], params, steps=1)
    assert later.steps[0].stages[0].top == as_prompt.steps[0].stages[0].top


def test_trace_refuses_bad_input(smol):
    with pytest.raises(ValueError, match="empty"):
        trace(smol, [], SamplingParams())
    with pytest.raises(ValueError, match="steps"):
        trace(smol, [1, 2], SamplingParams(), steps=0)
    with pytest.raises(ValueError, match=r"token id 49152 is not in \[0, 49152\)"):
        trace(smol, [1, 2], SamplingParams(), generated=[49152])
    with pytest.raises(ValueError, match="do not fit"):
        trace(smol, list(range(10)), SamplingParams(), steps=5, context=TraceContext(smol, 12))


def test_format_trace_table(smol):
    t = trace(smol, smol.tokenize("Hello"), SamplingParams(samplers=("top_k",), top_k=2, seed=1), n_top=2)
    text = format_trace(t)
    lines = text.splitlines()
    assert lines[0] == "chain: logits -> top-k -> dist"
    assert lines[1] == "prompt: 1 tokens"
    assert lines[3] == f"step 1: selected {t.tokens[0]} {t.steps[0].piece!r}"
    assert lines[4] == "  logits: 49152 candidates"
    assert "  top-k (k=2): 2 candidates, 49150 removed" in lines
    assert f"  dist (seed=1): 2 candidates, selected {t.tokens[0]}" in lines
    assert sum(line.startswith("  *") for line in lines) == 3  # the selected token, once per stage


# --- samplechain trace ---------------------------------------------------------------------------------------


def test_cli_trace_prints_the_tables_of_the_generated_tokens(smol, capsys):
    import json

    from samplechain.cli import main

    args = ["trace", "-p", "The ocean is", "--top-k", "5", "--n-top", "3", "--steps", "2", "--seed", "1"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = trace(smol, smol.tokenize("The ocean is"), SamplingParams(top_k=5, seed=1), n_top=3, steps=2)
    assert out == expected.to_dict()
    assert main(args) == 0
    assert capsys.readouterr().out == format_trace(expected) + "\n"


@pytest.mark.parametrize("args, message", [
    (["--n-top", "0"], "--n-top must be positive, got 0"),
    (["--steps", "0"], "--steps must be positive, got 0"),
    (["--top-k", "x"], "argument --top-k: invalid int value: 'x'"),
])
def test_cli_trace_bad_flags_are_usage_errors(args, message, capsys):
    from samplechain.cli import main

    with pytest.raises(SystemExit) as e:
        main(["trace", "-p", "Hi", *args])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
