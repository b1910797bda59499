import contextlib
import functools
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
    """transformers' tokenizers of the packaged GGUFs, made once per session (Gemma's takes tens of seconds)."""
    return functools.cache(reference_tokenizer)


@contextlib.contextmanager
def _gguf_read_once():
    """transformers reads a GGUF's header twice per load (the config, then the weights or the vocabulary: Gemma's
    262,144 tokens take tens of seconds each time) and builds gguf's tensor name map once per module (~400 times).
    Within one load: one reader per file and one map per architecture (both only read), the same result."""
    import gguf

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", functools.cache(gguf.GGUFReader))
        mp.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        yield


def reference_model(name):
    """transformers' implementation of the same GGUF (test-only reference)."""
    from transformers import AutoModelForCausalLM

    folder, file = os.path.split(model_path(name))
    with _gguf_read_once():
        return AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32).eval()


def reference_tokenizer(name):
    from transformers import AutoTokenizer

    folder, file = os.path.split(model_path(name))
    with _gguf_read_once():
        return AutoTokenizer.from_pretrained(folder, gguf_file=file)
