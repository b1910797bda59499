"""The processor inside a real (in-process, CPU) vLLM engine: every token vLLM emits for an opted-in request is
``CommonSampler``'s pick on the row the processor saw, with the same seed and history. Prompts are longer than the
engine's 32-token batch budget, so each is prefilled in chunks whose rows are sampled and thrown away."""

from __future__ import annotations

import re

import pytest
from vllm import SamplingParams as VSP

from samplechain.grammar import GrammarSampler
from samplechain.integrations.vllm import post_sampling_probs, request_params
from samplechain.params import CommonSampler

N_VOCAB = 49152


def prompt(start: int, n: int = 70) -> dict:
    return {"prompt_token_ids": [(start + 37 * i) % 40000 + 100 for i in range(n)]}


def run(llm, prompts, params):
    out = llm.generate(prompts, params, use_tqdm=False)
    llm.generate([prompt(1, 4)], VSP(max_tokens=1, temperature=0), use_tqdm=False)  # finished requests leave
    return out


def replay(vocab, extra, prompt_ids, steps, choice=0):
    """CommonSampler on the recorded rows: the tokens it picks and its post-sampling probabilities."""
    common = CommonSampler(request_params(extra, None, choice), vocab, n_vocab=N_VOCAB)
    for t in prompt_ids:
        common.accept(t, is_generated=False)
    tokens, probs = [], []
    for row in steps:
        tokens.append(common.sample(row))
        probs.append(common.top_probs(int(extra.get("n_probs", 0))))
    return tokens, probs


def rows_of(trace, tag):
    return [row for t, row, _ in trace if t == tag]


CHAINS = {
    "default": {"seed": 1},
    "topk-temp": {"seed": 2, "top_k": 12, "temperature": 0.7, "n_probs": 4},
    "minp-xtc": {"seed": 3, "min_p": 0.02, "xtc_probability": 0.5, "xtc_threshold": 0.05, "top_k": 0},
    "penalties-dry": {"seed": 4, "repeat_penalty": 1.3, "presence_penalty": 0.4, "dry_multiplier": 0.8,
                      "samplers": ["penalties", "dry", "top_k", "typ_p", "top_p", "min_p", "temperature"]},
    "mirostat2": {"seed": 5, "mirostat": 2, "mirostat_tau": 4.0},
    "top-n-sigma": {"seed": 6, "top_n_sigma": 1.5, "temperature": 1.2},
}


def test_exact_against_common_sampler(llm, proc, vocab):
    prompts = [prompt(i * 11) for i in range(len(CHAINS))]
    params = [VSP(max_tokens=12, extra_args={**extra, "samplechain_id": name}) for name, extra in CHAINS.items()]
    outs = run(llm, prompts, params)
    for (name, extra), p, out in zip(CHAINS.items(), prompts, outs, strict=True):
        emitted = list(out.outputs[0].token_ids)
        steps = rows_of(proc.trace, name)
        assert len(steps) == len(emitted) == 12, name
        tokens, probs = replay(vocab, extra, p["prompt_token_ids"], steps)
        assert tokens == emitted, name
        if extra.get("n_probs"):
            assert post_sampling_probs(name) == probs
            assert all(len(x) == 4 for x in probs)


def test_mixed_batch_and_batch_invariance(llm, proc):
    mine = {"seed": 77, "top_k": 30, "temperature": 0.9, "samplechain_id": "mine"}
    alone = run(llm, [prompt(5)], [VSP(max_tokens=10, extra_args=mine)])[0].outputs[0].token_ids
    plain_alone = run(llm, [prompt(9)], [VSP(max_tokens=10, temperature=0)])[0].outputs[0].token_ids
    crowd = [prompt(5), prompt(9), prompt(13, 20), prompt(17, 90)]
    params = [VSP(max_tokens=10, extra_args=mine), VSP(max_tokens=10, temperature=0),
              VSP(max_tokens=6, extra_args={"seed": 8, "samplechain_id": "other"}), VSP(max_tokens=10, temperature=0)]
    outs = run(llm, crowd, params)
    assert list(outs[0].outputs[0].token_ids) == list(alone)  # same seed, same tokens, whatever shares the batch
    assert list(outs[1].outputs[0].token_ids) == list(plain_alone)  # plain requests untouched
    assert {t for t, _, _ in proc.trace} == {"mine", "other"}  # only the opted-in requests were sampled


def test_vllm_sampling_settings_do_not_change_the_pick(llm):
    extra = {"seed": 123, "top_p": 0.9}
    a = run(llm, [prompt(3)], [VSP(max_tokens=8, extra_args=extra)])[0].outputs[0].token_ids
    b = run(llm, [prompt(3)], [VSP(max_tokens=8, temperature=0.01, top_k=3, repetition_penalty=1.5,
                                   extra_args=extra)])[0].outputs[0].token_ids
    assert list(a) == list(b)


def test_n_greater_than_one(llm, proc, vocab):
    extra = {"seed": 1000, "top_k": 50, "samplechain_id": "fam"}
    out = run(llm, [prompt(21)], [VSP(n=3, max_tokens=8, extra_args=extra)])[0]
    singles = [run(llm, [prompt(21)], [VSP(max_tokens=8, extra_args={**extra, "seed": 1000 + i})])[0]
               .outputs[0].token_ids for i in range(3)]
    got = sorted(list(c.token_ids) for c in out.outputs)
    assert got == sorted(list(s) for s in singles)
    assert len({tuple(s) for s in singles}) == 3


GRAMMAR = 'root ::= ("yes" | "no" | "maybe") ", " [a-z]{2,5} "."'


def test_grammar(llm, proc, vocab):
    extra = {"seed": 9, "grammar": GRAMMAR, "samplechain_id": "g"}
    out = run(llm, [prompt(31)], [VSP(max_tokens=20, extra_args=extra)])[0].outputs[0]
    ids = list(out.token_ids)
    assert ids[-1] in vocab.eog
    text = vocab.detokenize(ids[:-1])
    assert re.fullmatch(r"(yes|no|maybe), [a-z]{2,5}\.", text), text
    tokens, _ = replay(vocab, extra, prompt(31)["prompt_token_ids"], rows_of(proc.trace, "g"))
    assert tokens == ids


def test_json_schema(llm, proc, vocab):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    extra = {"seed": 10, "json_schema": schema, "top_k": 5, "samplechain_id": "js"}
    ids = list(run(llm, [prompt(41)], [VSP(max_tokens=40, extra_args=extra)])[0].outputs[0].token_ids)
    tokens, _ = replay(vocab, extra, prompt(41)["prompt_token_ids"], rows_of(proc.trace, "js"))
    assert tokens == ids
    g = GrammarSampler(vocab, __import__("samplechain.grammar", fromlist=["x"]).json_schema_to_gbnf(
        __import__("samplechain.grammar.json_schema", fromlist=["x"]).server_response_schema(schema)))
    for t in ids:
        if t not in vocab.eog:
            g.accept(t)  # raises when the grammar refuses a token


def test_lazy_grammar_with_token_trigger(llm, proc, vocab):
    extra = {"seed": 11, "grammar": 'root ::= <|im_start|> "ok."', "grammar_lazy": True,
             "grammar_triggers": [{"type": 0, "value": "<|im_start|>", "token": 1}],
             "logit_bias": [[1, 100.0]], "samplechain_id": "lazy"}
    ids = list(run(llm, [prompt(51)], [VSP(max_tokens=20, extra_args=extra)])[0].outputs[0].token_ids)
    assert ids[0] == 1 and ids[-1] in vocab.eog
    assert vocab.detokenize(ids[1:-1]) == "ok."
    tokens, _ = replay(vocab, extra, prompt(51)["prompt_token_ids"], rows_of(proc.trace, "lazy"))
    assert tokens == ids


def test_bad_field_is_refused_at_admission(llm):
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match="Field 'top_k'"):
        llm.generate([prompt(1, 4)], VSP(max_tokens=2, extra_args={"top_k": "many"}), use_tqdm=False)
