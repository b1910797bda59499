"""The runtime: GGUF models in torch, a llama.cpp-style KV cache, context shift, state files, generation.

The names below load on first use (PEP 562), so that the light modules of this package (``config``: how a model
loads; ``decoding``: the stop rules) can be read without torch, by ``samplechain --help`` for one."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names for type checkers (the same as __getattr__ gives)
    from samplechain.runtime.context import Context as Context
    from samplechain.runtime.decoding import Timings as Timings
    from samplechain.runtime.generation import MODEL_PACKAGES as MODEL_PACKAGES
    from samplechain.runtime.generation import Model as Model
    from samplechain.runtime.generation import load_model as load_model
    from samplechain.runtime.generation import model_path as model_path
    from samplechain.runtime.kv_cache import KVCache as KVCache
    from samplechain.runtime.kv_cache import KVCacheFull as KVCacheFull
    from samplechain.runtime.model import ModelConfig as ModelConfig
    from samplechain.runtime.model import Transformer as Transformer
    from samplechain.runtime.state import StateError as StateError

_HOMES = {"Context": "context", "Timings": "decoding", "MODEL_PACKAGES": "generation", "Model": "generation",
          "load_model": "generation", "model_path": "generation", "KVCache": "kv_cache", "KVCacheFull": "kv_cache",
          "ModelConfig": "model", "Transformer": "model", "StateError": "state"}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'samplechain.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(f"samplechain.runtime.{home}"), name)


def __dir__() -> list[str]:
    return [*globals(), *_HOMES]
