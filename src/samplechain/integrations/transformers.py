"""samplechain samplers inside ``transformers``' ``model.generate()`` (``pip install samplechain[transformers]``).

``SamplechainLogitsProcessor(chain)`` applies the chain's filtering and transforming samplers (logit bias,
penalties, top-k, top-p, min-p, temperature, ...) to the ``scores`` of every row, batched on the scores'
device, with llama.cpp's exact semantics: removed tokens get ``-inf``. Each row keeps its own copy of the
chain, so penalties see that row's tokens (prompt included, as llama.cpp's tools accept the prompt). A final
selector in the chain (dist, greedy) is left to ``generate()``: use ``do_sample=True`` for a random draw (then
with torch's generator, not llama.cpp's) or greedy decoding.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

from samplechain.chain import Chain
from samplechain.device.batch import BatchSampler
from samplechain.params import CommonSampler, SamplingParams


class SamplechainLogitsProcessor(LogitsProcessor):
    """A :class:`transformers.LogitsProcessor` running a chain's device prefix on ``scores`` batch-wise."""

    def __init__(self, chain: Chain | SamplingParams) -> None:
        if isinstance(chain, SamplingParams):
            if chain.grammar or chain.json_schema is not None or chain.mirostat:
                raise ValueError("grammars and mirostat need the CPU chain; they cannot run as a logits processor")
            common = CommonSampler(chain)
            if common.reasoning_budget is not None:
                raise ValueError("the reasoning budget needs the CPU chain; it cannot run as a logits processor")
            chain = common.chain
        if not isinstance(chain, Chain):
            raise ValueError(f"chain must be a Chain or SamplingParams, got {type(chain).__name__}")
        self.template = chain
        self._sampler: BatchSampler | None = None
        self._chains: list[Chain] = []
        self._seen: list[int] = []

    def _setup(self, batch: int, device: torch.device) -> None:
        self._chains = [self.template.clone() for _ in range(batch)]
        self._sampler = BatchSampler(self._chains, device, select_on_device=False)
        self._seen = [0] * batch

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        batch, length = input_ids.shape
        if self._sampler is None or len(self._chains) != batch or any(n > length for n in self._seen):
            self._setup(batch, scores.device)  # a new generate() call
        ids = input_ids.tolist()
        for i, chain in enumerate(self._chains):
            for token in ids[i][self._seen[i] :]:
                chain.accept(token)
            self._seen[i] = length
        out = self._sampler.process(scores)
        return out.to(scores.dtype)
