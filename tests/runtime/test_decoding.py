"""Sequence (one sequence's cells) and Decoder (the one step loop) on SmolLM2."""

import pytest

from samplechain import SamplingParams
from samplechain.runtime.decoding import Decoder, Rules
from samplechain.runtime.sequence import Sequence

GREEDY = SamplingParams(temperature=0.0)
PROMPT = ("Text: the cat sat on the mat, the dog sat on the log, the cow sat on the bow.\n\n"
          "The same text, copied exactly:\n\nText: the cat")


def test_sequence_keeps_its_tokens_and_cells_together(smol):
    ctx = smol.new_context(64)
    seq = Sequence(ctx)
    tokens = smol.tokenize("one two three four five six")
    seq.decode(tokens, outputs=[False] * len(tokens))
    assert seq.tokens == tokens and ctx.seq_pos_max(0) == len(tokens) - 1
    assert seq.reuse([*tokens[:4], 42, 43]) == 4  # the common prefix stays
    assert seq.tokens == tokens[:4] and ctx.seq_pos_max(0) == 3
    assert seq.reuse(tokens[:4]) == 3  # the last token is decoded again, for its logits
    assert seq.reuse(tokens[:4], n_fresh=0) == 3 and seq.positions(2) == range(3, 5)
    seq.decode(tokens[3:], outputs=[False] * (len(tokens) - 3))
    assert seq.shift(n_keep=1) and seq.tokens == [tokens[0], *tokens[1 + (len(tokens) - 1) // 2:]]
    assert ctx.seq_pos_max(0) == len(seq.tokens) - 1
    assert not seq.shift(n_keep=len(seq.tokens))  # nothing to drop: nothing changes
    seq.truncate(0)
    assert seq.tokens == [] and ctx.seq_pos_max(0) == -1


@pytest.mark.parametrize("n_ctx", [60, 64, 76])
def test_drafting_stops_where_plain_decoding_stops_in_a_full_context(smol, n_ctx):
    """Without context shift, a verified round that reaches the end of the context emits exactly the tokens plain
    decoding would: the context is judged at each token's own place, not after the whole round."""
    from samplechain.runtime.speculation import Speculation
    from samplechain.speculative.ngram import make_drafters

    n_prompt = len(smol.tokenize(PROMPT))
    plain = "".join(smol.generate(PROMPT, GREEDY, n_ctx=n_ctx, context_shift=False))
    assert smol.timings.n_sample == n_ctx - n_prompt
    spec = Speculation(make_drafters(["ngram-simple"], ngram_simple_size_n=2, ngram_simple_size_m=8), n_max=8,
                       adaptive=False)
    seen = []
    smol.on_token = lambda token, sampler: seen.append(token)
    try:
        drafted = "".join(smol.generate(PROMPT, GREEDY, n_ctx=n_ctx, context_shift=False, speculation=spec))
    finally:
        smol.on_token = None
    assert drafted == plain and len(seen) == n_ctx - n_prompt
    assert sum(s.accepted for s in spec.stats.values()) > 0


def test_a_decoder_reports_typed_events_under_the_server_rules(smol):
    ctx = smol.new_context(64)
    seq = Sequence(ctx)
    tokens = smol.tokenize("1, 2, 3, 4,")
    rows = seq.decode(tokens)
    from samplechain import CommonSampler

    sampler = CommonSampler(GREEDY, smol.vocab, n_vocab=smol.config.n_vocab)
    d = Decoder(seq, sampler, smol.vocab, Rules(n_predict=8, stop=(" 7",), server=True), n_prompt=len(tokens))
    events = d.step(rows)
    while not d.done:
        batch = d.feed()
        events += d.step(seq.decode(batch, outputs=[True] * len(batch)))
    *steps, final = events
    assert "".join(e.text for e in steps) == final.content == " 5, 6,"  # " 7" cut, and never sent
    assert (final.stop_type, final.stopping_word, final.n_decoded) == ("word", " 7", len(steps))
    assert [e.n_decoded for e in steps] == list(range(1, len(steps) + 1))
