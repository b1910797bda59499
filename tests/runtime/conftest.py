import os

import pytest
import torch

from samplechain.runtime import model_path


@pytest.fixture(scope="session")
def reference_models():
    """transformers' models of the packaged GGUFs, loaded once per session."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = reference_model(name)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def reference_tokenizers():
    return reference_tokenizer


def reference_model(name):
    """transformers' implementation of the same GGUF (test-only reference)."""
    from transformers import AutoModelForCausalLM

    folder, file = os.path.split(model_path(name))
    return AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32).eval()


def reference_tokenizer(name):
    from transformers import AutoTokenizer

    folder, file = os.path.split(model_path(name))
    return AutoTokenizer.from_pretrained(folder, gguf_file=file)
