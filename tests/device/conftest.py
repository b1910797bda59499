import numpy as np
import pytest
import torch


@pytest.fixture(scope="session")
def real_logits(smol) -> np.ndarray:
    """SmolLM2's logits (49,152 tokens) at every position of a short text: real distributions, peaked and flat."""
    model = smol
    text = ("The old lighthouse keeper climbed the stairs each evening, counting the steps aloud. "
            "Forty-two, he would say, and then light the lamp. Ships passed; storms came and went.")
    ids = model.tokenize(text)
    ctx = model.new_context(256)
    logits = ctx.decode(ids, outputs=[True] * len(ids))
    return logits.cpu().numpy()


@pytest.fixture
def batches(real_logits):
    """``batches(b, steps)``: ``steps`` logits tensors of ``b`` different real rows each."""
    def make(b: int, steps: int) -> list[torch.Tensor]:
        n = len(real_logits)
        return [torch.from_numpy(real_logits[[(s * 3 + 5 * r) % n for r in range(b)]].copy()) for s in range(steps)]
    return make
