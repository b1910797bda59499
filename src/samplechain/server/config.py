"""``samplechain serve``'s settings: ``ServerConfig``, whose options are declared once (``server/options.py``) for
the command line, ``--help`` and their checks. Light to import (no model code): ``samplechain --help`` builds its
flags from here."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from samplechain.param_specs import cli_non_negative_int, cli_non_negative_number, cli_number, cli_positive_int
from samplechain.server.options import option

if TYPE_CHECKING:
    from samplechain.server.request import Defaults
    from samplechain.speculative.config import SpeculationConfig


def _cache_type_error(flag: str, value: str) -> str | None:
    from samplechain.runtime.kv_cache import KV_TYPES, KV_TYPES_AS_F16

    known = [*KV_TYPES, *KV_TYPES_AS_F16]
    return None if value in known else f"{flag}: unsupported cache type {value!r} ({', '.join(known)})"


def _defaults() -> Defaults:
    from samplechain.server.request import Defaults

    return Defaults()


@dataclass
class ServerConfig:
    """``samplechain serve``'s settings (llama-server's flags, declared in common/arg.cpp)."""

    model: str | None = None
    host: str = option("127.0.0.1", "--host", check=lambda v: None if [h for h in v.split(",") if h.strip()]
                       else "--host requires at least one address",
                       help="addresses to listen on, comma-separated, or Unix socket paths ending in .sock; with "
                            "several addresses :: binds IPv6 only (default 127.0.0.1)")
    port: int = option(8080, "--port", type=cli_non_negative_int, help="port (default 8080; 0 = any free port)")
    n_slots: int = option(4, "-np", "--parallel", type=int, flag_default=-1,
                          check=lambda v: None if v == -1 or v > 0 else
                          f"-np/--parallel must be -1 (auto) or positive, got {v}",
                          convert=lambda v: 4 if v == -1 else v,
                          help="slots: requests generated at once (-1 = auto: 4)")
    n_ctx: int = option(0, "-c", "--ctx-size", type=cli_non_negative_int,
                        help="context size shared by the slots (0 = the model's training context)")
    n_batch: int = option(512, "-b", "--batch-size", type=int,
                          check=lambda v: None if v >= 1 else f"-b/--batch-size must be positive, got {v}",
                          help="tokens per forward (prompt chunks included)")
    n_threads: int | None = option(None, "-t", "--threads", type=int, help="CPU threads")
    device: str = option("cpu", "--device", help="torch device: cpu or cuda")
    kernel: str | None = option(None, "--kernel", help="CPU forward kernel (default: the fastest measured here)")
    cache_type_k: str = option("f16", "-ctk", "--cache-type-k",
                               check=lambda v: _cache_type_error("-ctk/--cache-type-k", v),
                               help="the KV cache's type for keys: f16 (default, as llama.cpp) or f32; llama.cpp's "
                                    "quantized types are kept as f16")
    cache_type_v: str = option("f16", "-ctv", "--cache-type-v",
                               check=lambda v: _cache_type_error("-ctv/--cache-type-v", v),
                               help="the KV cache's type for values: f16 (default) or f32")
    api_keys: tuple[str, ...] = ()
    # loopback pages only; "*" any origin (without credentials), or a list
    cors_origins: str = option("localhost", "--cors-origins",
                               help="origins whose pages may call the server: 'localhost' (loopback pages, the "
                                    "default), '*' (any page, without credentials), or a comma-separated list of "
                                    "origins")
    cors_methods: str = option("GET, POST, DELETE, OPTIONS", "--cors-methods", help="CORS: the methods allowed")
    cors_headers: str = option("*", "--cors-headers", help="CORS: the request headers allowed")
    cors_credentials: bool = option(True, "--cors-credentials", negative=("--no-cors-credentials",),
                                    action="store_true", help="CORS: pages may send credentials (default)")
    # seconds a request body may take, or a response's writes stay blocked (llama-server's)
    timeout: int = option(600, "-to", "--timeout", type=cli_positive_int,
                          help="HTTP read/write timeout in seconds: a silent request body or a client that reads "
                               "nothing")
    head_timeout: float = 10.0  # seconds for a request's head to arrive in full (slowloris)
    shutdown_grace: float = option(10.0, "--shutdown-grace", type=cli_non_negative_number,
                                   help="on SIGTERM/SIGINT, seconds running requests may finish before they are cut "
                                        "(default 10)")
    metrics: bool = option(False, "--metrics", action="store_true", help="enable /metrics")
    slots: bool = option(True, "--slots", negative=("--no-slots",), action="store_true",
                         help="enable /slots (default)")
    props: bool = option(False, "--props", action="store_true", help="allow POST /props")
    alias: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()  # informational, in /v1/models (llama-server's --tags)
    kv_unified: bool = option(False, "-kvu", "--kv-unified", negative=("-no-kvu", "--no-kv-unified"),
                              action="store_true",
                              help="the slots share one KV pool of -c cells, each may use all of it (default: a "
                                   "stream of -c / -np cells per slot, so a slot's text never depends on the others)")
    ui: bool = option(True, "--ui", "--webui", negative=("--no-ui", "--no-webui"), action="store_true",
                      help="serve the sampler-chain visualizer at / (default)")
    responses_store: int = option(256, "--responses-store", type=cli_non_negative_int, metavar="N",
                                  help="recent /v1/responses kept for previous_response_id (least recently used "
                                       "dropped; 0: none)")
    slot_save_path: str | None = option(None, "--slot-save-path",
                                        check=lambda v: None if v is None or os.path.isdir(v) else
                                        f"--slot-save-path: not a directory: {v}",
                                        help="folder for POST /slots/{id}?action=save|restore (a slot's KV cells in "
                                             "a file)")
    # a request takes the idle slot whose cached prompt shares the largest part of its own, when that part is over
    # this share of the request's prompt (else the least recently used slot); 0: always the least recently used
    slot_prompt_similarity: float = option(0.10, "-sps", "--slot-prompt-similarity", type=cli_number,
                                           metavar="SIMILARITY",
                                           check=lambda v: None if 0.0 <= v <= 1.0 else
                                           f"-sps/--slot-prompt-similarity must be within [0, 1], got {v}",
                                           help="how much of a request's prompt an idle slot's cached prompt must "
                                                "match for the request to take that slot (0.0 = off: the least "
                                                "recently used slot)")
    use_jinja: bool = True  # --jinja (llama-server's default) / --no-jinja: built-in templates only
    chat_template: str | None = None  # --chat-template(-file): a built-in name or jinja source, over the GGUF's
    reasoning_format: str = "auto"  # --reasoning-format: a chat request's default reasoning_format
    enable_thinking: bool | None = None  # --reasoning on / off (None: auto, the template's default)
    context_shift: bool = option(False, "--context-shift", action="store_true",
                                 help="shift a slot's context when it is full")
    special: bool = option(False, "--special", action="store_true", help="render special tokens in the output")
    defaults: Defaults = field(default_factory=_defaults)  # every request's defaults (the sampling flags)
    speculation: SpeculationConfig | None = None  # drafting in every slot (each task its own drafters), or None
    embedding: bool = False  # the embeddings routes answer (llama-server's --embedding)
    pooling: str | None = None  # how embeddings pool (--pooling); None: the model's own type, else none
    model_draft: str | None = None  # a draft model drafting in every slot (-md with --spec-type draft-simple)
    draft_params: dict[str, Any] = field(default_factory=dict)  # the DraftModel's n_max, n_min, p_min, sample, seed
    # after this many seconds without a request that uses the model, the model, its engine and KV cache are
    # released, and loaded again for the next request that needs them (server/sleep.py); -1: never
    sleep_idle_seconds: float = option(-1, "--sleep-idle-seconds", type=int, metavar="N",
                                       check=lambda v: None if v == -1 or v > 0 else
                                       f"--sleep-idle-seconds: cannot be 0 or less than -1, got {v}",
                                       help="unload the model after N idle seconds, reload it for the next request "
                                            "that needs it (-1: never)")

    def __post_init__(self) -> None:
        if self.sleep_idle_seconds == 0 or (self.sleep_idle_seconds < 0 and self.sleep_idle_seconds != -1):
            raise ValueError(f"sleep_idle_seconds: cannot be 0 or less than -1, got {self.sleep_idle_seconds}")
