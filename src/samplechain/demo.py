"""``python -m samplechain.demo``: a short tour of the sampler chain on synthetic logits.

The runtime (GGUF models, generation) arrives with its own issue; until then ``make run`` shows the chain.
"""

from __future__ import annotations

import numpy as np

from samplechain import Candidates, Chain, CommonSampler, Dist, MinP, SamplingParams, Temperature, TopK, TopP, Vocab


def main() -> None:
    words = ["the", " cat", " sat", " on", " a", " mat", ".", " dog", " ran", " far", "\n"]
    vocab = Vocab([w.encode() for w in words] + [b"</s>"], eos=len(words))
    rng = np.random.default_rng(0)
    table = rng.normal(0.0, 2.0, (vocab.n_tokens, vocab.n_tokens)).astype(np.float32)  # a toy bigram "model"

    chain = Chain([TopK(40), TopP(0.95), MinP(0.05), Temperature(0.8), Dist(seed=42)], perf=True)
    print("chain:   ", chain.describe())
    token, text = 0, words[0]
    for _ in range(12):
        token = chain.sample(table[token])
        if vocab.is_eog(token):
            break
        text += vocab.piece(token).decode()
    print("sampled: ", repr(text))

    sampler = CommonSampler(SamplingParams(seed=42, repeat_penalty=1.2, dry_multiplier=0.8), vocab)
    print("default: ", sampler.describe())
    token = sampler.sample(table[0])
    print("top probabilities after the chain:", [(vocab.piece(t).decode(), round(p, 3)) for t, p in
                                                  sampler.top_probs(3)])

    c = Candidates.from_logits(table[3])
    TopK(3).apply(c)
    print("top-3 candidates of ' on':", [vocab.piece(int(t)).decode() for t in c.ids])
    print(f"perf: {chain.perf.n_sample} tokens, {chain.perf.t_sample_ms:.3f} ms in the chain")


if __name__ == "__main__":
    main()
