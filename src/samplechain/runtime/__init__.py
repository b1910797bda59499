"""The runtime: GGUF models in torch, a llama.cpp-style KV cache, context shift, state files, generation."""

from samplechain.runtime.context import Context
from samplechain.runtime.decoding import Timings
from samplechain.runtime.generation import MODEL_PACKAGES, Model, load_model, model_path
from samplechain.runtime.kv_cache import KVCache, KVCacheFull
from samplechain.runtime.model import ModelConfig, Transformer
from samplechain.runtime.state import StateError

__all__ = ["MODEL_PACKAGES", "Context", "KVCache", "KVCacheFull", "Model", "ModelConfig", "StateError", "Timings",
           "Transformer", "load_model", "model_path"]
