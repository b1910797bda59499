"""The reasoning budget in SamplingParams and CommonSampler (llama.cpp's common_sampler_init, common_sampler_sample
and common_sampler_accept in common/sampling.cpp; the server fields of tools/server/server-schema.cpp)."""

import numpy as np
import pytest

from samplechain import CommonSampler, ReasoningBudget, ReasoningBudgetState, Sampler, SamplingParams, Vocab

S = ReasoningBudgetState
INT32_MAX = 2**31 - 1

# ids: 0 <think>, 1 </think>, 2 "a", 3 "b", 4 " ", 5 "Done", 6 ".", 7 <eos>
VOCAB = Vocab([b"<think>", b"</think>", b"a", b"b", b" ", b"Done", b".", b"<eos>"], special=[0, 1, 7], eog=[7])
# greedy picks "a" (2), then "b" (3)
LOGITS = np.array([0.0, 0.0, 3.0, 2.0, 0.0, 1.0, 1.0, 0.0], dtype=np.float32)
THINK = dict(temperature=0.0, reasoning_budget_tokens=2, reasoning_budget_start_tag="<think>",
             reasoning_budget_end_tags=("</think>",), reasoning_budget_message="Done.")


class Recorder(Sampler):
    """A stand-in grammar: refuses "a" (2), records what it sees."""

    name = "grammar"

    def __init__(self, lazy):
        self.is_lazy = lazy
        self.accepted = []
        self.finite_seen = []

    def apply(self, c):
        self.finite_seen.append(int(np.isfinite(c.logits).sum()))
        c.set_logits(np.where(c.ids == 2, np.float32(-np.inf), c.logits))

    def accept(self, token):
        self.accepted.append(token)


def test_defaults_build_no_budget():
    p = SamplingParams()
    assert (p.reasoning_budget_tokens, p.reasoning_budget_start_tag, p.reasoning_budget_end_tags) == (-1, "", ())
    assert (p.reasoning_budget_message, p.reasoning_budget_forced, p.reasoning_control, p.generation_prompt) == (
        "", None, False, "")
    assert CommonSampler(p, VOCAB).reasoning_budget is None


@pytest.mark.parametrize("kwargs, budget", [
    (dict(reasoning_budget_tokens=5), 5),
    (dict(reasoning_budget_tokens=0), 0),
    (dict(reasoning_budget_tokens=-1), None),  # no limit and nothing needs it: no sampler
    (dict(reasoning_budget_tokens=-1, reasoning_control=True), INT32_MAX),
    (dict(reasoning_budget_tokens=-1, grammar_lazy=True), INT32_MAX),
    (dict(reasoning_budget_tokens=5, reasoning_budget_start_tag=""), None),
    (dict(reasoning_budget_tokens=5, reasoning_budget_end_tags=()), None),
])
def test_when_the_budget_exists(kwargs, budget):
    rb = CommonSampler(SamplingParams(**{**THINK, **kwargs}), VOCAB).reasoning_budget
    assert (None if rb is None else rb.budget) == budget


def test_tags_are_tokenized_and_forced_is_message_then_first_end_tag():
    p = SamplingParams(**{**THINK, "reasoning_budget_end_tags": ("</think>", "", "<eos>")})
    rb = CommonSampler(p, VOCAB).reasoning_budget
    assert (rb.start, rb.end, rb.forced, rb.state) == (((0,),), ((1,), (7,)), (5, 6, 1), S.IDLE)
    assert CommonSampler(SamplingParams(**{**THINK, "reasoning_budget_message": ""}), VOCAB).reasoning_budget.forced \
        == (1,)
    ids = SamplingParams(reasoning_budget_tokens=3, reasoning_budget_start_tag=[0], reasoning_budget_end_tags=[[1]],
                         reasoning_budget_forced=[6, 1])
    rb = CommonSampler(ids, n_vocab=8).reasoning_budget  # token ids need no vocabulary
    assert (rb.start, rb.end, rb.forced, rb.budget) == (((0,),), ((1,),), (6, 1), 3)


def test_generated_tokens_count_and_the_end_is_forced():
    s = CommonSampler(SamplingParams(**THINK), VOCAB)
    s.accept(0)  # a prompt token: the budget does not see it
    assert s.reasoning_budget.state == S.IDLE
    s.accept(0, is_generated=True)
    assert s.reasoning_budget.state == S.COUNTING
    assert [s.sample(LOGITS) for _ in range(7)] == [2, 2, 5, 6, 1, 2, 2]
    assert s.reasoning_budget.state == S.DONE and s.reasoning_budget.end_match == (1,)
    assert list(s.prev) == [0, 0, 2, 2, 5, 6, 1, 2, 2]  # the chain and history see every token


def test_generation_prompt_opens_the_block():
    s = CommonSampler(SamplingParams(**THINK, generation_prompt="<think>"), VOCAB)
    assert (s.reasoning_budget.state, s.reasoning_budget.remaining) == (S.COUNTING, 2)
    assert [s.sample(LOGITS) for _ in range(6)] == [2, 2, 5, 6, 1, 2]


def test_generation_prompt_drops_a_leading_space_the_tokenizer_added():
    class SpacingVocab(Vocab):
        def tokenize(self, text, add_special=False, parse_special=False):
            return [4, *super().tokenize(text, add_special, parse_special)]

    v = SpacingVocab([bytes(VOCAB.token_bytes(i)) for i in range(8)], special=[0, 1, 7], eog=[7])
    p = SamplingParams(**{**THINK, "reasoning_budget_start_tag": [4, 0]}, generation_prompt="<think>")
    assert CommonSampler(p, v).reasoning_budget.state == S.IDLE  # " " dropped: [0] alone is not the start
    p = SamplingParams(**{**THINK, "reasoning_budget_start_tag": [4, 0]}, generation_prompt=" <think>")
    assert CommonSampler(p, v).reasoning_budget.state == S.COUNTING  # the text starts with a space: kept


def test_budget_applies_before_the_grammar():
    g = Recorder(lazy=False)
    s = CommonSampler(SamplingParams(**THINK, generation_prompt="<think>"), VOCAB, grammar=g)
    s.sample(LOGITS, grammar_first=True)
    s.sample(LOGITS, grammar_first=True)
    assert s.sample(LOGITS, grammar_first=True) == 5
    assert g.finite_seen == [8, 8, 1]  # while forcing, the grammar sees only the forced token


def test_non_lazy_grammar_sees_every_generated_token():
    g = Recorder(lazy=False)
    s = CommonSampler(SamplingParams(**THINK, generation_prompt="<think>"), VOCAB, grammar=g)
    s.accept(4)  # prompt token: neither budget nor grammar
    assert [s.sample(LOGITS) for _ in range(6)] == [3, 3, 5, 6, 1, 3]
    assert g.accepted == [3, 3, 5, 6, 1, 3]  # no replay: the grammar already saw the end tag


def test_lazy_grammar_waits_for_the_block_to_close_then_gets_the_end_tag():
    g = Recorder(lazy=True)
    s = CommonSampler(SamplingParams(**THINK, generation_prompt="<think>"), VOCAB, grammar=g)
    assert [s.sample(LOGITS) for _ in range(5)] == [2, 2, 5, 6, 1]  # "a" allowed: the grammar is suspended
    assert g.finite_seen == [] and g.accepted == [1]  # the end sequence is replayed when the block closes
    assert s.sample(LOGITS) == 3  # now the grammar applies (rejection: "a" refused, resampled)
    assert g.accepted == [1, 3]
    s.accept(0, is_generated=True)  # a new block suspends it again
    assert s.sample(LOGITS) == 2 and g.accepted == [1, 3, 0]


def test_lazy_grammar_triggered_by_the_forced_end_tag():
    # the trigger ("Done") is only ever forced, while the grammar is suspended: the replay is what fires it
    p = SamplingParams(temperature=0.0, reasoning_budget_tokens=2, reasoning_budget_start_tag="<think>",
                       reasoning_budget_end_tags=("Done",), generation_prompt="<think>",
                       grammar='root ::= "Done" "b"+', grammar_lazy=True, grammar_triggers=[(0, "Done", 5)])
    s = CommonSampler(p, VOCAB)
    assert [s.sample(LOGITS) for _ in range(6)] == [2, 2, 5, 3, 3, 3]
    assert s.grammar.active and s.reasoning_budget.state == S.DONE


def test_reset_rebuilds_the_budget_state_and_clone_copies_it():
    s = CommonSampler(SamplingParams(**THINK, generation_prompt="<think>"), VOCAB)
    s.sample(LOGITS)
    t = s.clone()
    assert [s.sample(LOGITS) for _ in range(5)] == [t.sample(LOGITS) for _ in range(5)] == [2, 5, 6, 1, 2]
    s.reset()
    assert (s.reasoning_budget.state, s.reasoning_budget.remaining) == (S.COUNTING, 2)  # generation_prompt again
    assert t.reasoning_budget.state == S.DONE
    u = CommonSampler(SamplingParams(**THINK), VOCAB)
    u.accept(0, is_generated=True)
    u.reset()
    assert u.reasoning_budget.state == S.IDLE


def test_force_reasoning_end():
    s = CommonSampler(SamplingParams(**{**THINK, "reasoning_budget_tokens": -1}, reasoning_control=True,
                                     generation_prompt="<think>"), VOCAB)
    assert s.sample(LOGITS) == 2 and s.reasoning_budget.remaining == INT32_MAX - 1
    assert s.force_reasoning_end() is True
    assert [s.sample(LOGITS) for _ in range(4)] == [5, 6, 1, 2]
    assert s.force_reasoning_end() is False
    assert CommonSampler(SamplingParams(), VOCAB).force_reasoning_end() is False


def test_a_given_budget_sampler_is_used():
    rb = ReasoningBudget(None, [[0]], [[1]], [6], 1, "counting")
    s = CommonSampler(SamplingParams(temperature=0.0), n_vocab=8, reasoning_budget=rb)
    assert [s.sample(LOGITS) for _ in range(3)] == [2, 6, 2] and s.reasoning_budget is rb
    with pytest.raises(ValueError, match="reasoning_budget must be a ReasoningBudget"):
        CommonSampler(reasoning_budget=Recorder(False))


@pytest.mark.parametrize("kwargs, vocab, n_vocab, match", [
    (THINK, None, 8, "reasoning_budget_start_tag '<think>' is a text: pass vocab"),
    ({**THINK, "reasoning_budget_start_tag": [0]}, None, 8, "reasoning_budget_end_tags '</think>' is a text"),
    ({**THINK, "reasoning_budget_start_tag": [9]}, None, 8, r"reasoning_budget_start_tag token 9 is outside"),
    ({**THINK, "reasoning_budget_start_tag": [0], "reasoning_budget_end_tags": [[1]], "reasoning_budget_forced": [8]},
     None, 8, "reasoning_budget_forced token 8 is outside"),
    ({**THINK, "reasoning_budget_start_tag": [0], "reasoning_budget_end_tags": [[1]]}, None, 8,
     "reasoning_budget_message 'Done.' is a text"),
    ({**THINK, "reasoning_budget_start_tag": [0], "reasoning_budget_end_tags": [[1]], "reasoning_budget_message": "",
      "generation_prompt": "x"}, None, 8, "generation_prompt needs the vocabulary"),
])
def test_common_sampler_errors(kwargs, vocab, n_vocab, match):
    with pytest.raises(ValueError, match=match):
        CommonSampler(SamplingParams(**kwargs), vocab, n_vocab=n_vocab)


# --- SamplingParams fields -----------------------------------------------------------------------------------

def test_from_dict_server_names_and_aliases():
    p = SamplingParams.from_dict({
        "reasoning_budget_tokens": 16, "reasoning_budget_start_tag": "<think>",
        "reasoning_budget_end_tags": ["</think>", "", "<eos>"], "reasoning_budget_message": "Done.",
        "reasoning_control": True, "generation_prompt": "<think>",
    })
    assert (p.reasoning_budget_tokens, p.reasoning_budget_start_tag, p.reasoning_budget_end_tags) == (
        16, "<think>", ("</think>", "<eos>"))
    assert (p.reasoning_budget_message, p.reasoning_control, p.generation_prompt) == ("Done.", True, "<think>")
    p = SamplingParams.from_dict({"reasoning_budget_end_tag": "</think>", "thinking_budget_tokens": 7})
    assert (p.reasoning_budget_end_tags, p.reasoning_budget_tokens) == (("</think>",), 7)
    # the field's own name wins over an alias, in either order
    assert SamplingParams.from_dict({"reasoning_budget_tokens": 3, "thinking_budget_tokens": 9}) \
        .reasoning_budget_tokens == 3
    assert SamplingParams.from_dict({"thinking_budget_tokens": 9, "reasoning_budget_tokens": 3}) \
        .reasoning_budget_tokens == 3
    assert SamplingParams.from_dict({"reasoning_budget_end_tag": "x", "reasoning_budget_end_tags": ["y"]}) \
        .reasoning_budget_end_tags == ("y",)
    # llama.cpp's common_params_sampling names carry token ids
    p = SamplingParams.from_dict({"reasoning_budget_start": [0], "reasoning_budget_end": [[1], [7]],
                                  "reasoning_budget_forced": [6, 1], "reasoning_budget_tokens": -1})
    assert (p.reasoning_budget_start_tag, p.reasoning_budget_end_tags, p.reasoning_budget_forced) == (
        (0,), ((1,), (7,)), (6, 1))


def test_round_trip():
    p = SamplingParams(**THINK, generation_prompt="<think>", reasoning_control=True)
    assert SamplingParams.from_dict(p.to_dict()) == p
    q = SamplingParams(reasoning_budget_start_tag=(0,), reasoning_budget_end_tags=((1,), "</think>"),
                       reasoning_budget_forced=(6, 1))
    d = q.to_dict()
    assert (d["reasoning_budget_start_tag"], d["reasoning_budget_end_tags"], d["reasoning_budget_forced"]) == (
        [0], [[1], "</think>"], [6, 1])
    assert SamplingParams.from_dict(d) == q


@pytest.mark.parametrize("body, field", [
    ({"reasoning_budget_tokens": -2}, "reasoning_budget_tokens"),
    ({"reasoning_budget_tokens": 2**31}, "reasoning_budget_tokens"),
    ({"reasoning_budget_tokens": "10"}, "reasoning_budget_tokens"),
    ({"thinking_budget_tokens": -5}, "thinking_budget_tokens"),
    ({"reasoning_budget_start_tag": 5}, "reasoning_budget_start_tag"),
    ({"reasoning_budget_end_tags": {"a": 1}}, "reasoning_budget_end_tags"),
    ({"reasoning_budget_end_tags": [3]}, "reasoning_budget_end_tags"),
    ({"reasoning_budget_end_tag": 3}, "reasoning_budget_end_tag"),
    ({"reasoning_budget_message": ["x"]}, "reasoning_budget_message"),
    ({"reasoning_budget_forced": [1, -1]}, "reasoning_budget_forced"),
    ({"reasoning_control": "yes"}, "reasoning_control"),
    ({"generation_prompt": 1}, "generation_prompt"),
])
def test_from_dict_rejects_with_the_field_name(body, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams.from_dict(body)


@pytest.mark.parametrize("kwargs, match", [
    ({"reasoning_budget_tokens": -2}, r"reasoning_budget_tokens must be -1 \(no limit\) or in \[0, 2147483647\]"),
    ({"reasoning_budget_tokens": 1.5}, "reasoning_budget_tokens must be an integer"),
    ({"reasoning_budget_start_tag": 3}, "reasoning_budget_start_tag must be a text or a list of token ids"),
    ({"reasoning_budget_start_tag": [True]}, "reasoning_budget_start_tag must be a list of token ids"),
    ({"reasoning_budget_end_tags": [101]}, "reasoning_budget_end_tags must be a text or a list of token ids"),
    ({"reasoning_budget_message": None}, "reasoning_budget_message must be a string"),
    ({"reasoning_budget_forced": "ab"}, "reasoning_budget_forced must be a list of token ids"),
    ({"reasoning_control": 1}, "reasoning_control must be true or false"),
    ({"generation_prompt": b"x"}, "generation_prompt must be a string"),
])
def test_constructor_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_a_single_end_tag_text_is_one_tag():
    assert SamplingParams(reasoning_budget_end_tags="</think>").reasoning_budget_end_tags == ("</think>",)


# --- the runtime: backend sampling is turned off, the text is cut at the budget ---------------------------------

def test_budget_turns_backend_sampling_off_and_ends_the_block(smol, capsys):
    model = smol  # SmolLM2: <|im_start|> = 1, <|im_end|> = 2 (end of generation)
    prompt = "The capital of France is"
    want = "".join(model.generate(prompt, SamplingParams(seed=4), n_predict=3))
    budget = SamplingParams(seed=4, backend_sampling=True, reasoning_budget_tokens=3,
                            reasoning_budget_start_tag="<|im_start|>", reasoning_budget_end_tags=("<|im_end|>",),
                            generation_prompt="<|im_start|>")
    # the block is open from the start; after 3 tokens the forced <|im_end|> ends the generation
    assert "".join(model.generate(prompt, budget, n_predict=20)) == want
    assert "backend sampling is off" in capsys.readouterr().err
