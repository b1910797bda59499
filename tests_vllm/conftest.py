"""Shared fixtures: the tiny model, SmolLM2's llama.cpp vocabulary, one in-process vLLM engine with the processor.

The engine runs with a 32-token batch budget, so every prompt longer than that is prefilled in chunks: the
processor sees (and must throw away) rows of unfinished prompts in every test that uses it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from tests_vllm.tiny_model import build, gguf_path

os.environ.setdefault("SAMPLECHAIN_VLLM_VOCAB", str(gguf_path()))
MODEL_DIR = Path(os.environ.get("TINY_LLAMA", "/tmp/samplechain-tiny-llama"))
MAX_BATCHED = 32


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return build(MODEL_DIR)


@pytest.fixture(scope="session")
def vocab():
    from samplechain.vocab import Vocab

    return Vocab.from_gguf(gguf_path())


@pytest.fixture(scope="session")
def llm(model_dir):
    from vllm import LLM

    from samplechain.integrations.vllm import SamplechainLogitsProcessor

    return LLM(str(model_dir), distributed_executor_backend="uni", enforce_eager=True, max_model_len=512, seed=0,
               max_num_batched_tokens=MAX_BATCHED, max_num_seqs=16, enable_chunked_prefill=True,
               logits_processors=[SamplechainLogitsProcessor])


@pytest.fixture
def proc(llm):
    """The engine's live processor (the entry point's instance; the explicit one is inert), tracing."""
    from samplechain.integrations.vllm import SamplechainLogitsProcessor

    live = [p for p in SamplechainLogitsProcessor.instances if not p.inert]
    assert len(live) == 1
    live[0].trace = []
    yield live[0]
    live[0].trace = None
