"""How a model loads and runs, declared once (``options.py``) for ``generate`` and ``serve`` (whose ``ServerConfig``
extends it): the context size and batch, the device, the CPU threads and kernel, and the KV cache's types
(llama.cpp's ``-ctk`` / ``-ctv``). Light to import: no torch (``samplechain --help`` reads it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from samplechain.options import option
from samplechain.validate import cli_non_negative_int

# llama.cpp's -ctk / -ctv names (common/arg.cpp: kv_cache_types): the types kept, then those kept as f16 with a note
CACHE_TYPES = ("f32", "f16")
CACHE_TYPES_AS_F16 = ("bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def cache_type_error(flag: str, name: str) -> str | None:
    """The error for a -ctk / -ctv value that names no cache type (None: it does)."""
    known = (*CACHE_TYPES, *CACHE_TYPES_AS_F16)
    return None if name in known else f"{flag}: unsupported cache type {name!r} ({', '.join(known)})"


@dataclass
class ModelOptions:
    """How a model loads and runs: the context's size and batch, and the options of ``load_model`` that a command
    line sets (``runtime/generation.py: load_model``)."""

    n_ctx: int = option(0, "-c", "--ctx-size", type=cli_non_negative_int,
                        help="context size (0 = model's)")  # serve: shared by the slots (split by -np unless -kvu)
    n_batch: int = option(512, "-b", "--batch-size", type=int,
                          check=lambda v: None if v >= 1 else f"-b/--batch-size must be positive, got {v}",
                          help="tokens per forward (prompt chunks included)")
    device: str = option("cpu", "--device", help="torch device: cpu or cuda")
    n_threads: int | None = option(None, "-t", "--threads", type=int, help="CPU threads")
    kernel: str | None = option(None, "--kernel",
                                help="CPU forward kernel (default: the fastest measured on this machine; see "
                                     "kernels.py)")
    cache_type_k: str = option("f16", "-ctk", "--cache-type-k", metavar="TYPE",
                               check=lambda v: cache_type_error("-ctk/--cache-type-k", v),
                               help="the KV cache's type for keys: f16 (default, as llama.cpp) or f32; llama.cpp's "
                                    "quantized types are kept as f16")
    cache_type_v: str = option("f16", "-ctv", "--cache-type-v", metavar="TYPE",
                               check=lambda v: cache_type_error("-ctv/--cache-type-v", v),
                               help="the KV cache's type for values: f16 (default) or f32")

    def load_options(self) -> dict[str, Any]:
        """``load_model``'s keyword arguments."""
        return dict(device=self.device, n_threads=self.n_threads, kernel=self.kernel,
                    cache_type_k=self.cache_type_k, cache_type_v=self.cache_type_v)
