"""``samplechain serve``'s settings: ``ServerConfig``, whose options are declared once (``options.py``) for
the command line, ``--help`` and their checks. Light to import (no model code): ``samplechain --help`` builds its
flags from here."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from samplechain.options import option
from samplechain.params import SamplingParams
from samplechain.runtime.config import ModelOptions
from samplechain.runtime.decoding import Rules
from samplechain.validate import cli_non_negative_int, cli_non_negative_number, cli_number, cli_positive_int

if TYPE_CHECKING:
    from samplechain.speculative.config import SpeculationConfig


_REASONING = {"on": True, "enabled": True, "true": True, "1": True, "off": False, "disabled": False, "false": False,
              "0": False, "auto": None}


def _names(value: str | None) -> tuple[str, ...]:
    """A comma-separated list of names (``-a``, ``--tags``)."""
    return tuple(n.strip() for n in (value or "").split(",") if n.strip())


@dataclass
class Defaults:
    """What a request gets for a field it leaves out or sets to null: the server's command line."""

    params: SamplingParams = field(default_factory=SamplingParams)
    rules: Rules = field(default_factory=Rules)  # n_predict, n_keep and stop (-n, --keep, -r)
    cache_prompt: bool = option(True, "--cache-prompt", negative=("--no-cache-prompt",), action="store_true",
                                help="reuse a slot's cached prompt (default)",
                                negative_help="every request evaluates its whole prompt")
    # every response carries ``__verbose`` unless the request says otherwise
    verbose: bool = option(False, "-v", "--verbose", "--log-verbose", action="store_true",
                           help="debug logging, and __verbose in every response (unless a request sets verbose "
                                "false)")


@dataclass
class ServerConfig(ModelOptions):
    """``samplechain serve``'s settings (llama-server's flags, declared in common/arg.cpp); how the model loads is
    ``ModelOptions``' (``runtime/config.py``), shared with ``generate``."""

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
    alias: tuple[str, ...] = option((), "-a", "--alias", flag_default=None, convert=_names, metavar="ALIAS",
                                    help="model id(s) for the API, comma-separated")
    tags: tuple[str, ...] = option((), "--tags", flag_default=None, convert=_names, metavar="TAGS",
                                   help="model tags, comma-separated (informational: /v1/models)")
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
    use_jinja: bool = option(True, "--jinja", negative=("--no-jinja",), action="store_true",
                             help="render chat templates with jinja (default, as llama-server)",
                             negative_help="only llama.cpp's built-in chat templates (detected from the model's)")
    chat_template: str | None = None  # --chat-template(-file): a built-in name or jinja source, over the GGUF's
    reasoning_format: str = option("auto", "--reasoning-format",
                                   choices=("none", "auto", "deepseek", "deepseek-legacy"),
                                   help="a chat request's default reasoning_format: none leaves thoughts in the "
                                        "content")
    # thinking in chat templates: on / off, None: auto (the template's default)
    enable_thinking: bool | None = option(None, "-rea", "--reasoning", flag_default="auto", metavar="REASONING",
                                          check=lambda v: None if v in _REASONING else
                                          f"--reasoning: unknown value {v!r} (on, off or auto)",
                                          convert=_REASONING.get,
                                          help="thinking in chat templates: on, off or auto (the template's default)")
    context_shift: bool = option(False, "--context-shift", negative=("--no-context-shift",), action="store_true",
                                 help="shift a slot's context when it is full",
                                 negative_help="a full slot stops its request (default)")
    special: bool = option(False, "--special", action="store_true", help="render special tokens in the output")
    defaults: Defaults = field(default_factory=Defaults)  # every request's defaults (the sampling flags)
    speculation: SpeculationConfig | None = None  # drafting in every slot (each task its own drafters), or None
    embedding: bool = option(False, "--embedding", "--embeddings", action="store_true",
                             help="serve /embedding, /embeddings and /v1/embeddings (completions are served too)")
    pooling: str | None = option(None, "--pooling", choices=("none", "mean", "cls", "last", "rank"),
                                 help="how embeddings pool the prompt's tokens (default: the model's own type, else "
                                      "none)")
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
