"""Chat sessions (llama-cli's conversation mode), built-in chat templates, chat context shifts."""

import pytest
import torch

from samplechain import SamplingParams
from samplechain.runtime.chat import BUILTIN_TEMPLATES, ChatSession, builtin_template_name, header_text, render

GREEDY = SamplingParams(temperature=0.0)


def test_turns_keep_the_history_in_the_cache(smol):
    session = ChatSession(smol, GREEDY, n_ctx=512)
    assert "".join(session.send("What is the capital of France?")) == "The capital of France is Paris."
    n_past = session.n_past
    answer = "".join(session.send("And of Germany?"))
    assert answer == "The capital of Germany is Berlin."  # "And of" only makes sense with the first turn
    assert [m["role"] for m in session.messages] == ["user", "assistant", "user", "assistant"]
    # the second turn decoded only its own tokens (plus the first answer's end-of-turn token), not the history
    delta = smol.tokenize("\n<|im_start|>user\nAnd of Germany?<|im_end|>\n<|im_start|>assistant\n",
                          add_special=False, parse_special=True)
    assert session.timings.n_prompt == len(smol.tokenize(smol.apply_chat_template("What is the capital of France?"),
                                                         add_special=False)) + 1 + len(delta)
    assert session.n_past > n_past


def test_a_session_answers_like_a_single_chat_generation(smol):
    want = "".join(smol.generate("Name three colors.", GREEDY, n_predict=24, chat=True))
    assert "".join(ChatSession(smol, GREEDY, n_predict=24).send("Name three colors.")) == want


def test_system_prompt_is_the_first_turn(smol):
    session = ChatSession(smol, GREEDY, system_prompt="You answer in one word.", n_ctx=256, n_predict=8)
    "".join(session.send("Capital of Italy?"))
    assert session.messages[0] == {"role": "system", "content": "You answer in one word."}
    header = header_text(smol, "You answer in one word.")
    assert header == "<|im_start|>system\nYou answer in one word.<|im_end|>\n<|im_start|>user\n"
    assert session.n_keep == len(smol.tokenize(header, add_special=False))


def test_context_shift_keeps_the_system_prompt_and_header(smol):
    session = ChatSession(smol, SamplingParams(seed=3), n_ctx=96, n_predict=40)
    kv = session.ctx.kv
    "".join(session.send("Tell me about the sea."))
    keep = kv.seq_positions(0)[: session.n_keep]
    before = kv.k[:, :, keep].clone()
    shifts = smol.context_shifts
    for question in ("And the wind?", "And the sky?", "And the rain?"):
        assert "".join(session.send(question))
    assert smol.context_shifts > shifts
    cells = kv.seq_positions(0)[: session.n_keep]
    assert kv.pos[cells].tolist() == list(range(session.n_keep))
    assert torch.equal(kv.k[:, :, cells], before)  # never discarded nor re-rotated


def test_plain_text_turns(smol):
    session = ChatSession(smol, GREEDY, n_predict=12, template=False, reverse_prompts=["."])
    first = "".join(session.send("The capital of France is"))
    assert first.endswith(".") or len(smol.tokenize(first)) >= 12
    assert "".join(session.send(" Also,"))
    with pytest.raises(ValueError, match="empty"):
        "".join(ChatSession(smol, GREEDY, template=False).send(""))


def test_gemma_gets_its_builtin_template(gemma):
    assert gemma.vocab.chat_template is None and builtin_template_name(gemma.vocab) == "gemma"
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    assert gemma.apply_chat_template(msgs) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    tokens = gemma.tokenize(gemma.apply_chat_template("Hi"), add_special=False, parse_special=True)
    assert tokens[:2] == [gemma.vocab.bos, 105]  # <bos><start_of_turn> as special tokens


def test_chatml_is_the_default_builtin(smol):
    assert builtin_template_name(smol.vocab) == "chatml"
    assert render(BUILTIN_TEMPLATES["chatml"], smol.vocab, [{"role": "user", "content": "x"}], True) == (
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="role and content"):
        render(BUILTIN_TEMPLATES["chatml"], smol.vocab, [{"role": "user"}], True)


def test_chat_generation_keeps_the_header_on_context_shift(smol):
    """--chat with the default --keep 0 keeps the system prompt and chat header (no garbage after the shift)."""
    text = "".join(smol.generate("Write a long story about a dragon.", SamplingParams(seed=1), n_predict=120,
                                 chat=True, n_ctx=80))
    assert smol.context_shifts >= 1 and len(text) > 200


def test_drafting_gives_the_same_conversation(smol):
    """Seeded sampling with penalties, a reverse prompt that stops inside a verified round, context shifts: every
    answer equals the one without drafting, turn after turn (the sampler and cache are rewound to the stop)."""
    from samplechain.runtime.speculation import Speculation
    from samplechain.speculative.ngram import make_drafters

    params = SamplingParams(seed=7, temperature=0.7, repeat_penalty=1.05)
    turns = ["Repeat after me: the cat sat on the mat, the cat sat on the mat.",
             "Again, exactly: the cat sat on the mat, the cat sat on the mat.", "And once more."]

    def converse(spec):
        s = ChatSession(smol, params, n_ctx=160, n_predict=40, reverse_prompts=["on the"], speculation=spec)
        return [("".join(s.send(t)), s.n_past, list(s.sampler.prev)) for t in turns]

    plain = converse(None)
    spec = Speculation(make_drafters(["ngram-simple"], ngram_simple_size_n=2, ngram_simple_size_m=8), n_max=8,
                       adaptive=False)
    assert converse(spec) == plain
    assert sum(s.accepted for s in spec.stats.values()) > 0
    assert all(answer.endswith("on the") for answer, _, _ in plain)  # the reverse prompt stopped every turn
