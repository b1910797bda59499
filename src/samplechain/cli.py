"""The ``samplechain`` command: ``samplechain generate`` with llama.cpp's flag names and defaults."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import NoReturn

from samplechain.param_specs import cli_budget, cli_seed, declarations, flag_help, read_text_file
from samplechain.param_specs import cli_non_negative_int as _non_negative_int
from samplechain.param_specs import cli_non_negative_number as _non_negative_float
from samplechain.param_specs import cli_number as _number
from samplechain.param_specs import cli_positive_int as _positive_int
from samplechain.param_specs import unescape as _unescape
from samplechain.params import SamplingParams


class _HelpFormatter(argparse.HelpFormatter):
    """Each flag's default after its meaning, unless the meaning already says it (the sampling flags' help is
    generated with theirs) or there is nothing to show (switches, empty values)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if not text or "(default" in text or not action.option_strings or action.default in (None, "", []) \
                or isinstance(action.default, bool) or action.default is argparse.SUPPRESS:
            return text
        return text + " (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (the message, where to find the usage) and exit status 2.

    Every message of a subcommand, usage errors and run-time errors alike, starts ``samplechain <command>:
    error:`` (argparse's form, with the subcommand's name); arguments no subcommand knows are reported by it.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (usage: {self.prog} --help)\n")

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None,
                         ) -> tuple[argparse.Namespace, list[str]]:
        """llama.cpp reads ``--a_b`` as ``--a-b`` (llama-server's test suite passes ``--backend_sampling``)."""
        if args is not None:
            args = [self._dashed(a) for a in args]
        return super().parse_known_args(args, namespace)

    def _dashed(self, arg: str) -> str:
        name, eq, value = arg.partition("=")
        fixed = name.replace("_", "-")
        if name.startswith("--") and name not in self._option_string_actions and fixed in self._option_string_actions:
            return fixed + eq + value
        return arg

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command_parser(self, parsed).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed


def command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The subcommand's own parser (``samplechain generate``), whose name prefixes its errors; else ``parser``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(getattr(args, action.dest, None), parser)
    return parser


def add_sampling_arguments(parser_or_group: argparse.ArgumentParser | argparse._ArgumentGroup, *,
                           constraints: argparse._ArgumentGroup | None = None,
                           params_type: type[SamplingParams] = SamplingParams) -> None:
    """Add every sampling flag declared on ``SamplingParams`` (llama.cpp's names and defaults).

    ``generate`` and ``serve`` share them, so the server's per-request defaults are its flags. ``constraints``:
    where the grammar / JSON-schema flags go (default: with the others).
    """
    for d in declarations(params_type):
        for f in d.cli:
            target = constraints if f.group == "constraints" and constraints is not None else parser_or_group
            options = dict(f.options)
            if "action" not in options and "default" not in options:
                options["default"] = d.default
            if options.get("type") in _NUMBERS and "choices" not in options:
                options.setdefault("metavar", "N")
            text = flag_help(d, f)
            options["help"] = text if text in (None, argparse.SUPPRESS) else text.replace("%", "%%")
            target.add_argument(*f.names, **options)


_NUMBERS = (int, _number, cli_seed, cli_budget)  # their values read as N in --help, as llama.cpp's


def params_from_args(args: argparse.Namespace, *,
                     params_type: type[SamplingParams] = SamplingParams) -> SamplingParams:
    """The flags added by :func:`add_sampling_arguments` as ``SamplingParams`` (ValueError on invalid values)."""
    constraints = [f for d in declarations(params_type) for f in d.cli if f.group == "constraints"]
    given = [next(n for n in f.names if n.startswith("--")) for f in constraints if getattr(args, f.dest) is not None]
    if len(given) > 1:
        raise ValueError(f"use only one of {', '.join(given)}")
    return params_type(**{d.name: d.value_from_args(args) for d in declarations(params_type)
                          if d.cli or d.from_args is not None})


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="samplechain", description="llama.cpp's token sampling, rebuilt in Python")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    g = sub.add_parser("generate", help="generate text from a prompt (llama.cpp's completion flags)")
    io = g.add_argument_group("model and prompt")
    io.add_argument("-m", "--model", default=None,
                    help="GGUF file, or a packaged model: smollm2 (default), gemma3-270m")
    _add_hf_arguments(io)
    io.add_argument("-p", "--prompt", default=None, help="prompt text")
    io.add_argument("-f", "--file", default=None, help="read the prompt from a file")
    io.add_argument("--display-prompt", dest="display_prompt", action="store_true", default=True,
                    help="print the prompt before the generated text (default)")
    io.add_argument("--no-display-prompt", dest="display_prompt", action="store_false",
                    help="print only the generated text")
    io.add_argument("-n", "--n-predict", "--predict", type=int, default=-1, metavar="N",
                    help="tokens to generate (-1 = until end of generation or the context limit)")
    io.add_argument("-c", "--ctx-size", type=_non_negative_int, default=4096, metavar="N",
                    help="context size (0 = model's)")
    io.add_argument("-b", "--batch-size", type=int, default=512, metavar="N", help="prompt tokens per forward")
    io.add_argument("-t", "--threads", type=int, default=None, metavar="N", help="CPU threads")
    io.add_argument("--keep", type=int, default=0, metavar="N",
                    help="tokens of the prompt kept on context shift (-1 = all)")
    io.add_argument("--context-shift", dest="context_shift", action="store_true", default=True,
                    help="shift the context when it is full (default)")
    io.add_argument("--no-context-shift", dest="context_shift", action="store_false",
                    help="stop generating when the context is full")
    io.add_argument("--prompt-cache", default=None, help="file to cache the prompt's state in")
    io.add_argument("--prompt-cache-ro", action="store_true", help="use the prompt cache without updating it")
    io.add_argument("--chat", action="store_true", help="apply the model's chat template to the prompt, answer once")
    io.add_argument("-cnv", "--conversation", action="store_true",
                    help="conversation mode: chat turns read from stdin, the history kept in the KV cache")
    io.add_argument("-i", "--interactive", action="store_true",
                    help="interactive mode: continue the text with lines read from stdin (no chat template)")
    io.add_argument("-sys", "--system-prompt", default=None, help="system prompt (conversation mode)")
    io.add_argument("-r", "--reverse-prompt", action="append", default=[],
                    help="stop generating at this text and wait for input (repeatable)")
    io.add_argument("--in-prefix", default="", help="text before each input line (interactive mode)")
    io.add_argument("--in-suffix", default="", help="text after each input line (interactive mode)")
    io.add_argument("--n-probs", type=_non_negative_int, default=0, metavar="N",
                    help="print each generated token's top N post-sampling probabilities (to stderr)")
    io.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="gpu_layers", type=int, default=None,
                    help="accepted for llama.cpp compatibility: the whole model runs on --device")
    io.add_argument("--device", default="cpu", help="torch device: cpu or cuda")
    io.add_argument("--kernel", default=None,
                    help="CPU forward kernel (default: the fastest measured on this machine; see kernels.py)")
    io.add_argument("--escape", dest="escape", action="store_true", default=True,
                    help="process escapes (\\n, \\t, ...) in the prompt (default)")
    io.add_argument("--no-escape", dest="escape", action="store_false", help="take the prompt as written")
    io.add_argument("--verbose-prompt", action="store_true", help="print the prompt's tokens to stderr")

    s = g.add_argument_group("sampling (llama.cpp's flags and defaults)")
    sp = g.add_argument_group("speculative decoding (llama.cpp's flags; the text is the same with or without)")
    c = g.add_argument_group("constrained output")
    add_sampling_arguments(s, constraints=c)
    _add_spec_arguments(sp)
    _add_serve_parser(sub)
    _add_trace_parser(sub)
    return parser


def _add_hf_arguments(group: argparse._ArgumentGroup) -> None:
    """llama.cpp's Hugging Face flags (common/arg.cpp; what they do: runtime/hub.py, imported only when used)."""
    group.add_argument("-hf", "-hfr", "--hf-repo", dest="hf_repo", default=None, metavar="USER/REPO[:QUANT]",
                       help="GGUF model from a Hugging Face repo, downloaded once into the hub cache: the quant is "
                            "case-insensitive, default Q4_K_M, else Q8_0, else the repo's first GGUF")
    group.add_argument("-hff", "--hf-file", dest="hf_file", default=None, metavar="FILE",
                       help="this file of the -hf repo (the quant is then not used)")
    group.add_argument("-hft", "--hf-token", dest="hf_token", default=None, metavar="TOKEN",
                       help="Hugging Face access token (default: $HF_TOKEN, or the token huggingface_hub stored)")
    group.add_argument("--offline", action="store_true",
                       help="-hf from the hub cache only: nothing is downloaded (as HF_HUB_OFFLINE=1)")


def _add_spec_arguments(sp: argparse._ArgumentGroup) -> None:
    """llama.cpp's speculative decoding flags (``generate`` and ``serve``)."""
    sp.add_argument("--spec-type", action="append", default=[],
                    help="comma-separated drafters: ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, "
                         "ngram-cache, draft-simple (with -md), none; repeatable")
    sp.add_argument("--spec-default", action="store_true", help="ngram-mod with n-match 24, n-min 48, n-max 64")
    sp.add_argument("-md", "--model-draft", "--spec-draft-model", dest="model_draft", default=None,
                    help="draft model GGUF (used by --spec-type draft-simple); with -hfd, the file of that repo")
    sp.add_argument("-hfd", "-hfrd", "--hf-repo-draft", "--spec-draft-hf", dest="hf_repo_draft", default=None,
                    metavar="USER/REPO[:QUANT]", help="draft model from a Hugging Face repo, as -hf")
    sp.add_argument("--draft-max", "--draft", "--draft-n", "--spec-draft-n-max", dest="draft_max",
                    type=_non_negative_int, default=16, help="longest draft (the length adapts below it)")
    sp.add_argument("--draft-min", "--draft-n-min", "--spec-draft-n-min", dest="draft_min",
                    type=_non_negative_int, default=0, help="shorter drafts are dropped")
    sp.add_argument("--draft-p-min", "--spec-draft-p-min", dest="draft_p_min", type=_number, default=0.0,
                    help="draft model: stop drafting below this top-10 probability")
    sp.add_argument("--spec-verify", choices=("compare", "sample"), default="compare",
                    help="compare: llama.cpp's sample-and-compare (same text as without drafting); sample: "
                         "distribution-preserving speculative sampling (draft model)")
    sp.add_argument("--spec-no-adaptive", action="store_true", help="always draft up to --draft-max")
    for kind in ("simple", "map-k", "map-k4v"):
        for what, default in (("size-n", 12), ("size-m", 48), ("min-hits", 1)):
            sp.add_argument(f"--spec-ngram-{kind}-{what}", type=int, default=default, help=argparse.SUPPRESS)
    for what, default in (("n-match", 24), ("n-min", 48), ("n-max", 64)):
        sp.add_argument(f"--spec-ngram-mod-{what}", type=int, default=default, help=argparse.SUPPRESS)
    sp.add_argument("-lcs", "--lookup-cache-static", default=None, help="ngram-cache: static n-gram statistics")
    sp.add_argument("-lcd", "--lookup-cache-dynamic", default=None, help="ngram-cache: dynamic n-gram statistics")


def _add_serve_parser(sub: argparse._SubParsersAction) -> None:
    """``samplechain serve``: llama-server's flags that matter (spec/server.md §9); the sampling flags become
    every request's defaults."""
    sv = sub.add_parser("serve", help="HTTP server: llama-server's and OpenAI's API, continuously batched")
    o = sv.add_argument_group("server")
    o.add_argument("-m", "--model", default=None, help="GGUF file, or a packaged model: smollm2 (default), gemma3-270m")
    _add_hf_arguments(o)
    o.add_argument("--host", default="127.0.0.1",
                   help="addresses to listen on, comma-separated, or Unix socket paths ending in .sock; with several "
                        "addresses :: binds IPv6 only (default 127.0.0.1)")
    o.add_argument("--port", type=_non_negative_int, default=8080, help="port (default 8080; 0 = any free port)")
    o.add_argument("-np", "--parallel", type=int, default=-1,
                   help="slots: requests generated at once (-1 = auto: 4)")
    o.add_argument("-c", "--ctx-size", type=_non_negative_int, default=0,
                   help="context size shared by the slots (0 = the model's training context)")
    o.add_argument("-b", "--batch-size", type=int, default=512, help="tokens per forward (prompt chunks included)")
    o.add_argument("-ub", "--ubatch-size", type=int, default=512, help=argparse.SUPPRESS)
    o.add_argument("-n", "--n-predict", "--predict", type=int, default=-1, help="default tokens per request")
    o.add_argument("--keep", type=int, default=0, help="default tokens kept on context shift (-1 = the prompt)")
    o.add_argument("-t", "--threads", type=int, default=None, help="CPU threads")
    o.add_argument("-tb", "--threads-batch", type=int, default=None, help=argparse.SUPPRESS)
    o.add_argument("--threads-http", type=int, default=-1, help=argparse.SUPPRESS)
    o.add_argument("--device", default="cpu", help="torch device: cpu or cuda")
    o.add_argument("--kernel", default=None, help="CPU forward kernel (default: the fastest measured here)")
    o.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="gpu_layers", type=int, default=None,
                   help="accepted for llama.cpp compatibility: the whole model runs on --device")
    o.add_argument("--api-key", default=None, help="comma-separated API keys (also $LLAMA_API_KEY)")
    o.add_argument("--api-key-file", default=None, help="file with one API key per line (# comments)")
    o.add_argument("--cors-origins", default="localhost",
                   help="origins whose pages may call the server: 'localhost' (loopback pages, the default), '*' "
                        "(any page, without credentials), or a comma-separated list of origins")
    o.add_argument("--cors-methods", default="GET, POST, DELETE, OPTIONS")
    o.add_argument("--cors-headers", default="*")
    o.add_argument("--cors-credentials", dest="cors_credentials", action="store_true", default=True)
    o.add_argument("--no-cors-credentials", dest="cors_credentials", action="store_false")
    o.add_argument("-to", "--timeout", type=_positive_int, default=600,
                   help="HTTP read/write timeout in seconds: a silent request body or a client that reads nothing")
    o.add_argument("--shutdown-grace", type=_non_negative_float, default=10.0,
                   help="on SIGTERM/SIGINT, seconds running requests may finish before they are cut (default 10)")
    o.add_argument("-cb", "--cont-batching", action="store_true", default=True,
                   help="continuous batching (always on)")
    o.add_argument("-a", "--alias", default=None, help="model id(s) for the API, comma-separated")
    o.add_argument("--tags", default=None, help="model tags, comma-separated (informational: /v1/models)")
    o.add_argument("-kvu", "--kv-unified", dest="kv_unified", action="store_true", default=False,
                   help="the slots share one KV pool of -c cells, each may use all of it (default: a stream of "
                        "-c / -np cells per slot, so a slot's text never depends on the others)")
    o.add_argument("-no-kvu", "--no-kv-unified", dest="kv_unified", action="store_false")
    o.add_argument("--ui", "--webui", dest="ui", action="store_true", default=True,
                   help="serve the sampler-chain visualizer at / (default)")
    o.add_argument("--no-ui", "--no-webui", dest="ui", action="store_false")
    o.add_argument("--responses-store", type=_non_negative_int, default=256, metavar="N",
                   help="recent /v1/responses kept for previous_response_id (least recently used dropped; 0: none)")
    o.add_argument("--slot-save-path", default=None,
                   help="folder for POST /slots/{id}?action=save|restore (a slot's KV cells in a file)")
    o.add_argument("--jinja", dest="jinja", action="store_true", default=True,
                   help="render chat templates with jinja (default, as llama-server)")
    o.add_argument("--no-jinja", dest="jinja", action="store_false",
                   help="only llama.cpp's built-in chat templates (detected from the model's)")
    o.add_argument("--chat-template", default=None,
                   help="chat template: a built-in name (chatml, llama3, gemma, mistral-v7, ...) or jinja source")
    o.add_argument("--chat-template-file", default=None, help="chat template (jinja source) read from a file")
    o.add_argument("--reasoning-format", default="auto", choices=("none", "auto", "deepseek", "deepseek-legacy"),
                   help="a chat request's default reasoning_format: none leaves thoughts in the content")
    o.add_argument("-rea", "--reasoning", default="auto",
                   help="thinking in chat templates: on, off or auto (the template's default)")
    o.add_argument("-v", "--verbose", "--log-verbose", action="store_true",
                   help="debug logging, and __verbose in every response (unless a request sets verbose false)")
    o.add_argument("--metrics", action="store_true", help="enable /metrics")
    o.add_argument("--slots", dest="slots", action="store_true", default=True, help="enable /slots (default)")
    o.add_argument("--no-slots", dest="slots", action="store_false")
    o.add_argument("--props", action="store_true", help="allow POST /props")
    o.add_argument("--context-shift", action="store_true", help="shift a slot's context when it is full")
    o.add_argument("-r", "--reverse-prompt", action="append", default=[], help="default stop string (repeatable)")
    o.add_argument("--special", action="store_true", help="render special tokens in the output")
    o.add_argument("--cache-prompt", dest="cache_prompt", action="store_true", default=True)
    o.add_argument("--no-cache-prompt", dest="cache_prompt", action="store_false")
    o.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"),
                   help="HTTP server log level")
    n = sv.add_argument_group("llama-server flags that mean nothing here (accepted, with a note)")
    n.add_argument("-fa", "--flash-attn", default=None, help="on|off|auto: the attention kernels are chosen by measure")
    n.add_argument("--sleep-idle-seconds", type=int, default=-1, help="the model stays loaded")
    n.add_argument("-cram", "--cache-ram", type=int, default=None, help="no host-memory prompt cache")
    n.add_argument("--cache-idle-slots", dest="cache_idle_slots", action="store_true", default=None,
                   help="idle slots keep their cells")
    n.add_argument("--no-cache-idle-slots", dest="cache_idle_slots", action="store_false")
    n.add_argument("-ctk", "--cache-type-k", default=None, help="the KV cache keeps the model's compute type")
    n.add_argument("-ctv", "--cache-type-v", default=None, help="the KV cache keeps the model's compute type")
    n.add_argument("--swa-full", action="store_true", help="sliding-window layers keep every cell already")
    n.add_argument("-gan", "--grp-attn-n", type=int, default=None, help="no group attention (self-extend)")
    n.add_argument("-gaw", "--grp-attn-w", type=int, default=None, help="no group attention (self-extend)")
    n.add_argument("--tools", default=None, help="the web UI's built-in agent tools are not provided")
    n.add_argument("--tools-runtime", default=None, help="the web UI's built-in agent tools are not provided")
    n.add_argument("--ui-mcp-proxy", action="store_true", help="no MCP proxy (/cors-proxy)")
    n.add_argument("--mcp-servers-config", "--mcp-servers-json", dest="mcp_servers", default=None,
                   help="no MCP proxy (/cors-proxy)")
    n.add_argument("--media-path", default=None, help="no multimodal input (image parts are a 400)")
    n.add_argument("-mmu", "--mmproj-url", "-mm", "--mmproj", dest="mmproj", default=None,
                   help="no multimodal projector (image parts are a 400)")
    n.add_argument("--no-mmproj", action="store_true", help="there is no multimodal projector anyway")
    x = sv.add_argument_group("llama-server features not provided (a precise error, not an unknown flag)")
    x.add_argument("--lora", "--lora-scaled", dest="lora", action="append", default=None, help="LoRA adapters")
    x.add_argument("--reranking", "--rerank", action="store_true", help="the /rerank route (needs a reranker head)")
    x.add_argument("--models-dir", "--models-max", "--models-preset", dest="router", default=None,
                   help="router mode (several models behind one server)")
    x.add_argument("--no-models-autoload", dest="router", action="store_const", const="", help=argparse.SUPPRESS)
    s = sv.add_argument_group("sampling: every request's defaults (llama.cpp's flags and defaults)")
    add_sampling_arguments(s)
    spec = sv.add_argument_group("speculative decoding per slot (n-gram drafters, a draft model; same text as "
                                 "without)")
    _add_spec_arguments(spec)
    spec.add_argument("--spec-synth-rates", type=_rates, default=None, metavar="P0,P1,...",
                      help="benchmarking: draft position i is accepted at random with unconditional probability Pi "
                           "(one per --draft-max position, non-increasing) instead of by comparison")
    spec.add_argument("--spec-synth-len", type=_number, default=None, metavar="L",
                      help="benchmarking: geometric synthetic acceptance with mean acceptance length L (with the "
                           "target token)")
    # embeddings (llama-server's --embedding and --pooling; -md is with the speculative flags)
    e = sv.add_argument_group("embeddings")
    e.add_argument("--embedding", "--embeddings", dest="embedding", action="store_true",
                   help="serve /embedding, /embeddings and /v1/embeddings (completions are served too)")
    e.add_argument("--pooling", choices=("none", "mean", "cls", "last", "rank"), default=None,  # runtime.embeddings
                   help="how embeddings pool the prompt's tokens (default: the model's own type, else none)")
    r = sv.add_argument_group("Ray Serve (samplechain.integrations.ray_serve; needs ray[serve])")
    r.add_argument("--ray", action="store_true",
                   help="serve as replicas on Ray Serve (a conversation stays on its replica's cache)")
    r.add_argument("--replicas", type=_positive_int, default=None, help="engine replicas with --ray (default 1)")
    r.add_argument("--ray-address", default=None,
                   help="Ray cluster to join with --ray (default: a local Ray on loopback)")


def _rates(value: str) -> list[float]:
    """``--spec-synth-rates``: comma-separated numbers (llama.cpp parses each whole, else "invalid value")."""
    try:
        return [float(v.strip()) for v in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {value!r}") from None


def _add_trace_parser(sub: argparse._SubParsersAction) -> None:
    """``samplechain trace``: the candidates after each stage of the chain for the next token(s), as tables."""
    tr = sub.add_parser("trace", help="show how each sampler of the chain reshapes the next token's distribution")
    io = tr.add_argument_group("model and prompt")
    io.add_argument("-m", "--model", default=None,
                    help="GGUF file, or a packaged model: smollm2 (default), gemma3-270m")
    _add_hf_arguments(io)
    io.add_argument("-p", "--prompt", required=True, help="prompt text")
    io.add_argument("--chat", action="store_true", help="apply the model's chat template to the prompt")
    io.add_argument("--n-top", type=int, default=10, help="candidates shown per stage (default 10)")
    io.add_argument("--steps", type=int, default=1,
                    help="tokens traced, each appended before the next is traced (default 1)")
    io.add_argument("--json", action="store_true", help="print the trace as JSON (the /sampling/trace body)")
    io.add_argument("--device", default="cpu", help="torch device: cpu or cuda")
    io.add_argument("-t", "--threads", type=int, default=None, help="CPU threads")
    io.add_argument("--escape", dest="escape", action="store_true", default=True,
                    help="process escapes (\\n, \\t, ...) in the prompt (default)")
    io.add_argument("--no-escape", dest="escape", action="store_false")
    add_sampling_arguments(tr.add_argument_group("sampling (llama.cpp's flags and defaults)"))


def trace(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import json

    from samplechain.trace import format_trace
    from samplechain.trace import trace as run_trace

    if args.n_top < 1:
        parser.error(f"--n-top must be positive, got {args.n_top}")
    if args.steps < 1:
        parser.error(f"--steps must be positive, got {args.steps}")
    try:
        params = params_from_args(args)
        _check_constraint(params)
    except ValueError as e:
        parser.error(str(e))
    prompt = _unescape(args.prompt) if args.escape else args.prompt
    from samplechain.runtime.chat import starts_with_bos

    _from_hub(args)
    model = _load_model(args.model, args)
    text = model.apply_chat_template(prompt) if args.chat else prompt
    tokens = model.tokenize(text, add_special=not args.chat or not starts_with_bos(model.vocab, text))
    if not tokens:
        parser.error("the prompt is empty")
    result = run_trace(model, tokens, params, n_top=args.n_top, steps=args.steps)
    print(json.dumps(result.to_dict(), ensure_ascii=False) if args.json else format_trace(result))
    return 0


def _api_keys(args: argparse.Namespace) -> tuple[str, ...]:
    import os


    keys = [k for k in (args.api_key or os.environ.get("LLAMA_API_KEY", "")).split(",") if k]
    if args.api_key_file is not None:
        keys += [line.strip() for line in read_text_file(args.api_key_file, "API key file").splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]
    return tuple(keys)


def serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from samplechain.runtime.speculation import Speculation, synth_probabilities
    from samplechain.server.app import ServerConfig
    from samplechain.server.app import serve as run_server
    from samplechain.server.request import Defaults

    if args.parallel == 0 or args.parallel < -1:
        parser.error(f"-np/--parallel must be -1 (auto) or positive, got {args.parallel}")
    if args.batch_size < 1:
        parser.error(f"-b/--batch-size must be positive, got {args.batch_size}")
    if args.n_predict < -1:
        parser.error(f"-n/--n-predict must be -1 or more, got {args.n_predict}")
    if not [h for h in args.host.split(",") if h.strip()]:
        parser.error("--host requires at least one address")
    if not args.ray and (args.replicas is not None or args.ray_address is not None):
        parser.error("--replicas / --ray-address need --ray")
    if args.slot_save_path is not None and not os.path.isdir(args.slot_save_path):
        parser.error(f"--slot-save-path: not a directory: {args.slot_save_path}")
    reasoning = {"on": True, "enabled": True, "true": True, "1": True, "off": False, "disabled": False,
                 "false": False, "0": False, "auto": None}
    if args.reasoning not in reasoning:
        parser.error(f"--reasoning: unknown value {args.reasoning!r} (on, off or auto)")
    template = args.chat_template
    if args.chat_template_file is not None:
        try:
            template = read_text_file(args.chat_template_file, "chat template file")
        except ValueError as e:
            parser.error(f"--chat-template-file: {e}")
    if template is not None:
        from samplechain.server.state import chat_template

        try:
            chat_template(None, template, args.jinja)
        except ValueError as e:
            parser.error(str(e))
    kv_types = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
    for flag, value in (("-ctk/--cache-type-k", args.cache_type_k), ("-ctv/--cache-type-v", args.cache_type_v)):
        if value is not None and value not in kv_types:
            parser.error(f"{flag}: unsupported cache type {value!r} ({', '.join(kv_types)})")
    if args.flash_attn is not None and args.flash_attn not in ("on", "off", "auto", "enabled", "disabled", "true",
                                                               "false", "1", "0"):
        parser.error(f"-fa/--flash-attn: unknown value {args.flash_attn!r} (on, off or auto)")
    if args.sleep_idle_seconds == 0 or args.sleep_idle_seconds < -1:
        parser.error(f"--sleep-idle-seconds: cannot be 0 or less than -1, got {args.sleep_idle_seconds}")
    for given, feature in ((args.lora, "LoRA adapters (--lora)"), (args.reranking, "reranking (--reranking)"),
                           (args.router is not None, "router mode (--models-dir / --models-max / --models-preset)")):
        if given:
            parser.error(f"{feature}: not provided by samplechain serve")
    notes = [(args.tools is not None or args.tools_runtime is not None,
              "--tools: the web UI's built-in agent tools are not provided (OpenAI tool calls are)"),
             (args.ui_mcp_proxy or args.mcp_servers is not None, "--ui-mcp-proxy / --mcp-servers-*: no MCP proxy"),
             (args.media_path is not None or args.mmproj is not None or args.no_mmproj,
              "--media-path / --mmproj / --no-mmproj: no multimodal input here (image parts are a 400)"),
             (args.flash_attn is not None, "-fa: the attention kernels are chosen by measurement"),
             (args.sleep_idle_seconds > 0, "--sleep-idle-seconds: the model stays loaded"),
             (args.cache_ram is not None or args.cache_idle_slots is not None,
              "--cache-ram / --cache-idle-slots: each slot keeps its prompt in its own cells; no host-memory cache"),
             (args.cache_type_k is not None or args.cache_type_v is not None,
              "-ctk / -ctv: the KV cache keeps the model's compute type"),
             (args.swa_full, "--swa-full: sliding-window layers keep every cell already"),
             (args.grp_attn_n is not None or args.grp_attn_w is not None,
              "--grp-attn-n / --grp-attn-w: no group attention here (llama-server ignores it too)")]
    for given, note in notes:
        if given:
            print(f"note: {note}", file=sys.stderr)
    from samplechain.runtime.generation import model_path, resolve_device

    _from_hub(args)
    model_path(args.model)  # a missing model or device is one line now, not a server that cannot load
    resolve_device(args.device)
    params = params_from_args(args)
    _check_constraint(params)
    defaults = Defaults(params=params, n_predict=args.n_predict, n_keep=args.keep,
                        stop=tuple(r for r in args.reverse_prompt if r), cache_prompt=args.cache_prompt,
                        verbose=args.verbose)
    # embeddings and the draft model (--embedding, --pooling, -md with --spec-type draft-simple)
    n_batch = args.batch_size
    if args.embedding and n_batch > args.ubatch_size > 0:  # llama-server: a prompt to embed fits in one ubatch
        print(f"warning: embeddings enabled with n_batch ({n_batch}) > n_ubatch ({args.ubatch_size}): setting "
              f"n_batch = n_ubatch = {args.ubatch_size}", file=sys.stderr)
        n_batch = args.ubatch_size
    drafting = "draft-simple" in {t.strip() for v in _spec_types(args) for t in v.split(",")}
    if drafting and args.model_draft is None:
        parser.error("--spec-type draft-simple needs a draft model (-md)")
    if args.model_draft is not None and not drafting:
        print("note: -md is used only with --spec-type draft-simple", file=sys.stderr)
    if drafting:
        model_path(args.model_draft)
    _speculation(args, None, serving=True)  # bad drafter names and lengths are usage errors now
    try:
        synth = synth_probabilities(args.spec_synth_rates, args.spec_synth_len, args.draft_max)
    except ValueError as e:
        parser.error(str(e))
    if synth and not _spec_types(args):
        parser.error("synthetic acceptance requires an initialized speculative decoding context (--spec-type)")

    def speculation() -> Speculation:
        """A task's drafting: with synthetic acceptance, fixed lengths up to --draft-max (as llama.cpp)."""
        spec = _speculation(args, None, serving=True)
        if synth:
            spec.synth, spec.adaptive = synth, False
        return spec

    config = ServerConfig(
        speculation=speculation if _spec_types(args) else None,
        embedding=args.embedding, pooling=args.pooling, model_draft=args.model_draft if drafting else None,
        draft_params={"n_max": max(1, args.draft_max), "n_min": args.draft_min, "p_min": args.draft_p_min,
                      "sample": args.spec_verify == "sample", "seed": args.seed},
        model=args.model, host=args.host, port=args.port, n_slots=4 if args.parallel == -1 else args.parallel,
        n_ctx=args.ctx_size, n_batch=n_batch, n_threads=args.threads, device=args.device,
        kernel=args.kernel, api_keys=_api_keys(args), cors_origins=args.cors_origins,
        cors_methods=args.cors_methods, cors_headers=args.cors_headers, cors_credentials=args.cors_credentials,
        timeout=args.timeout, shutdown_grace=args.shutdown_grace, metrics=args.metrics, slots=args.slots,
        props=args.props, alias=tuple(a.strip() for a in (args.alias or "").split(",") if a.strip()),
        tags=tuple(t.strip() for t in (args.tags or "").split(",") if t.strip()), kv_unified=args.kv_unified,
        ui=args.ui, slot_save_path=args.slot_save_path, responses_store=args.responses_store,
        use_jinja=args.jinja, chat_template=template,
        reasoning_format=args.reasoning_format, enable_thinking=reasoning[args.reasoning],
        context_shift=args.context_shift, special=args.special, defaults=defaults)
    if args.ray:
        from samplechain.integrations.ray_serve import serve_ray

        return serve_ray(config, args.replicas or 1, args.ray_address, args.log_level)
    return run_server(config, log_level="debug" if args.verbose else args.log_level)


def _check_constraint(params: SamplingParams) -> None:
    """Refuse a bad grammar or schema before the model loads (token items are resolved later, with the model)."""
    from samplechain.grammar import Grammar, json_schema_to_gbnf, parse_gbnf

    text = json_schema_to_gbnf(params.json_schema) if params.json_schema is not None else params.grammar
    if text.strip():
        Grammar(parse_gbnf(text, tokenize=lambda _: [0]))


def generate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.prompt is not None and args.file is not None:
        parser.error("use one of -p/--prompt and -f/--file")
    prompt = args.prompt
    if args.file is not None:
        try:
            prompt = read_text_file(args.file, "prompt file")
        except ValueError as e:
            parser.error(str(e))
    elif prompt is not None and args.escape:
        prompt = _unescape(prompt)
    prompt = prompt or ""
    if args.n_predict < -1:
        parser.error(f"argument -n/--n-predict: must be -1 or more, got {args.n_predict}")
    try:
        params = params_from_args(args)
        _check_constraint(params)
    except ValueError as e:
        parser.error(str(e))
    params = _resolve_seed(params, args)

    if args.batch_size < 1:
        parser.error(f"-b/--batch-size must be positive, got {args.batch_size}")
    if (args.conversation or args.interactive) and args.prompt_cache is not None:
        parser.error("--prompt-cache is not supported with -cnv/-i")
    if args.prompt_cache is not None:
        folder = os.path.dirname(os.path.abspath(args.prompt_cache))
        if not os.path.isdir(folder):
            parser.error(f"--prompt-cache: the folder {folder} does not exist")
        if os.path.isdir(args.prompt_cache):
            parser.error(f"--prompt-cache: {args.prompt_cache} is a folder, not a file")
    _from_hub(args)
    model = _load_model(args.model, args, kernel=args.kernel)
    if args.gpu_layers is not None and model.transformer.device.type == "cpu":
        print(f"note: -ngl {args.gpu_layers} is ignored: the whole model runs on the cpu (--device cuda for a GPU)",
              file=sys.stderr)
    n_ctx = args.ctx_size or model.config.n_ctx_train
    ctx = model.new_context(n_ctx, n_batch=args.batch_size)
    chat = args.chat or args.conversation
    # the text as llama.cpp's completion tool feeds it (a chat turn is tokenized with its template, later)
    tokens = None if chat else model.tokenize(prompt)
    speculation = _speculation(args, model)
    if args.verbose_prompt:
        print(f"prompt tokens: {model.tokenize(prompt) if tokens is None else tokens}", file=sys.stderr)
    _print_sampler(model, params, args, n_ctx)
    probs: list[tuple[int, list[tuple[int, float]]]] = []
    if args.n_probs:
        model.on_token = lambda token, sampler: probs.append((token, sampler.top_probs(args.n_probs)))
    timings = model.timings
    if args.display_prompt and prompt:  # specials (BOS) show as nothing; a chat prompt as llama-cli echoes it
        sys.stdout.write(f"> {prompt}\n" if chat else _pieces(model, tokens))
        sys.stdout.flush()
    try:
        if args.conversation or args.interactive:
            timings = _interactive(model, params, args, prompt, ctx, probs, speculation)
        else:
            _stream(model.generate(prompt if chat else tokens, params, args.n_predict, chat=args.chat,
                                   n_keep=args.keep, context_shift=args.context_shift,
                                   prompt_cache=args.prompt_cache, prompt_cache_ro=args.prompt_cache_ro,
                                   context=ctx, speculation=speculation))
            sys.stdout.write("\n")
            timings = model.timings
            _print_probs(model, probs)
    except KeyboardInterrupt as e:  # Ctrl-C: the timings so far, llama.cpp's exit status
        sys.stdout.write("\n")
        sys.stdout.flush()
        if args.perf:
            print(getattr(e, "timings", model.timings).report(), file=sys.stderr)
        return 130
    sys.stdout.flush()
    if args.perf:
        print(timings.report(), file=sys.stderr)
    if speculation is not None:
        print(speculation.report(), file=sys.stderr)
    return 0


def _from_hub(args: argparse.Namespace) -> None:
    """-hf / -hfd: ``args.model`` / ``args.model_draft`` become the files they name, downloaded into the hub cache
    or found there (runtime/hub.py: llama.cpp's choice of file, one-line errors)."""
    if args.hf_repo or args.hf_file or getattr(args, "hf_repo_draft", None):
        from samplechain.runtime.hub import resolve_model_args

        resolve_model_args(args)


def _load_model(name: str | None, args: argparse.Namespace, kernel: str | None = None) -> object:
    """``load_model``, said first on stderr (a large model takes seconds); a missing model or device is refused
    before that, in one line."""
    from samplechain.runtime import load_model
    from samplechain.runtime.generation import model_path, resolve_device

    path = model_path(name)
    resolve_device(args.device)
    print(f"loading model {path} ...", file=sys.stderr, flush=True)
    return load_model(path, device=args.device, n_threads=args.threads, kernel=kernel)


def _resolve_seed(params: SamplingParams, args: argparse.Namespace) -> SamplingParams:
    """A random seed (-1) drawn now, as llama.cpp's samplers draw it, so that it can be printed and the run
    repeated with ``--seed N``; every seeded sampler and the drafter then use it."""
    from samplechain.rng import resolve_seed

    args.seed = resolve_seed(params.seed)
    return dataclasses.replace(params, seed=args.seed)


def _sampler_params(p: SamplingParams) -> str:
    """llama.cpp's ``common_params_sampling::print()`` (its values are C floats, printed with ``%.3f``)."""
    import numpy as np

    def f(x: float) -> str:
        return f"{float(np.float32(x)):.3f}"

    return (f"\trepeat_last_n = {p.repeat_last_n}, repeat_penalty = {f(p.repeat_penalty)}, "
            f"frequency_penalty = {f(p.frequency_penalty)}, presence_penalty = {f(p.presence_penalty)}\n"
            f"\tdry_multiplier = {f(p.dry_multiplier)}, dry_base = {f(p.dry_base)}, "
            f"dry_allowed_length = {p.dry_allowed_length}, dry_penalty_last_n = {p.dry_penalty_last_n}\n"
            f"\ttop_k = {p.top_k}, top_p = {f(p.top_p)}, min_p = {f(p.min_p)}, "
            f"xtc_probability = {f(p.xtc_probability)}, xtc_threshold = {f(p.xtc_threshold)}, "
            f"typical_p = {f(p.typical_p)}, top_n_sigma = {f(p.top_n_sigma)}, temp = {f(p.temperature)}\n"
            f"\tmirostat = {p.mirostat}, mirostat_lr = {f(p.mirostat_eta)}, mirostat_ent = {f(p.mirostat_tau)}, "
            f"adaptive_target = {f(p.adaptive_target)}, adaptive_decay = {f(p.adaptive_decay)}")


def _print_sampler(model: object, params: SamplingParams, args: argparse.Namespace, n_ctx: int) -> None:
    """What llama.cpp's completion tool prints before generating: the seed in use, the parameters, the chain."""
    from samplechain.params import CommonSampler
    from samplechain.rng import DEFAULT_SEED

    # the grammar is no member of the chain (llama.cpp keeps it apart): the copy that names the chain skips it
    chain = CommonSampler(dataclasses.replace(params, grammar="", json_schema=None), model.vocab,  # type: ignore
                          n_vocab=model.config.n_vocab)  # type: ignore[attr-defined]
    seed = chain.seed
    print(f"sampler seed: {DEFAULT_SEED if seed is None else seed}", file=sys.stderr)
    print(f"sampler params: \n{_sampler_params(params)}", file=sys.stderr)
    print(f"sampler chain: {chain.describe()}", file=sys.stderr)
    print(f"generate: n_ctx = {n_ctx}, n_batch = {args.batch_size}, n_predict = {args.n_predict}, "
          f"n_keep = {args.keep}\n", file=sys.stderr)
    if sys.stdin.isatty() and (args.conversation or args.interactive):
        print(f"{'conversation' if args.conversation else 'interactive'} mode: type a line and press Return; "
              f"{'/exit or ' if args.conversation else ''}Ctrl-D to leave, Ctrl-C to stop at once\n", file=sys.stderr)


def _pieces(model: object, tokens: Sequence[int]) -> str:
    """Tokens as llama.cpp's completion tool displays them: each token's piece, special tokens as nothing."""
    piece = model.vocab.piece  # type: ignore[attr-defined]
    return b"".join(piece(t) for t in tokens).decode("utf-8", "replace")


def _spec_types(args: argparse.Namespace) -> list[str]:
    types = [t for value in args.spec_type for t in ([value] if "none" not in value.split(",") else [])]
    if args.spec_default:
        types.append("ngram-mod")
    return types


def _speculation(args: argparse.Namespace, model: object, serving: bool = False) -> object | None:
    """The drafters the flags ask for (llama.cpp: a draft model is used only with --spec-type draft-simple).
    ``serving``: the server's, per task: its slots have the draft model (``Engine``), nothing is said here."""
    from samplechain.runtime.speculation import Speculation
    from samplechain.speculative.ngram import make_drafters

    types = _spec_types(args)
    names = {t.strip() for value in types for t in value.split(",")}
    if args.model_draft is not None and "draft-simple" not in names and not serving:
        print("note: -md is used only with --spec-type draft-simple", file=sys.stderr)
    if not names:
        return None
    params = {f"ngram_{kind.replace('-', '_')}_{what.replace('-', '_')}":
              getattr(args, f"spec_ngram_{kind.replace('-', '_')}_{what.replace('-', '_')}")
              for kind in ("simple", "map-k", "map-k4v") for what in ("size-n", "size-m", "min-hits")}
    if args.spec_default:
        params.update(ngram_mod_n_match=24, ngram_mod_n_min=48, ngram_mod_n_max=64)
    else:
        params.update(ngram_mod_n_match=args.spec_ngram_mod_n_match, ngram_mod_n_min=args.spec_ngram_mod_n_min,
                      ngram_mod_n_max=args.spec_ngram_mod_n_max)
    params.update(lookup_cache_static=args.lookup_cache_static, lookup_cache_dynamic=args.lookup_cache_dynamic)
    drafters = make_drafters(types, **params)
    if "draft-simple" in names and not serving:
        if args.model_draft is None:
            raise ValueError("--spec-type draft-simple needs a draft model (-md)")
        from samplechain.speculative.draft_model import DraftModel

        draft = _load_model(args.model_draft, args)
        drafters.append(DraftModel(draft, model.vocab, n_max=max(1, args.draft_max),  # type: ignore[attr-defined]
                                   n_min=args.draft_min, p_min=args.draft_p_min, n_ctx=args.ctx_size or 4096,
                                   sample=args.spec_verify == "sample", seed=args.seed))
    return Speculation(drafters, n_max=args.draft_max, n_min=args.draft_min, adaptive=not args.spec_no_adaptive,
                       verify=args.spec_verify, seed=args.seed)


def _stream(pieces: Iterable[str]) -> None:
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()


def _print_probs(model: object, probs: list[tuple[int, list[tuple[int, float]]]]) -> None:
    """One line per generated token on stderr: the token, then its step's top post-sampling probabilities."""
    def show(token: int) -> str:
        return repr(model.vocab.token_bytes(token).decode("utf-8", "replace"))  # type: ignore[attr-defined]

    for token, top in probs:
        print(f"{show(token):>16} <- " + ", ".join(f"{show(t)} {p:.4f}" for t, p in top), file=sys.stderr)
    probs.clear()


def _interactive(model, params: SamplingParams, args: argparse.Namespace, prompt: str, ctx,
                 probs: list, speculation: object | None = None) -> object:
    """llama-cli's conversation (-cnv) and interactive (-i) modes: turns read from stdin until end of input."""
    from samplechain.runtime.chat import ChatSession

    session = ChatSession(model, params, system_prompt=args.system_prompt, n_predict=args.n_predict,
                          context_shift=args.context_shift, reverse_prompts=args.reverse_prompt, context=ctx,
                          template=args.conversation, speculation=speculation)
    tty = sys.stdin.isatty()

    def turn(text: str) -> None:
        _stream(session.send(text))
        sys.stdout.write("\n")
        sys.stdout.flush()
        _print_probs(model, probs)

    try:
        if prompt:
            turn(prompt)
        while True:
            if tty:
                sys.stdout.write("> ")
                sys.stdout.flush()
            line = sys.stdin.readline()
            if not line:  # end of input (Ctrl-D on a terminal: the timings start on a line of their own)
                if tty:
                    sys.stdout.write("\n")
                break
            line = line.rstrip("\n")
            if args.conversation and line.startswith("/exit"):  # llama-cli's command
                break
            if not line.strip():
                continue
            turn(line if args.conversation else args.in_prefix + line + args.in_suffix)
    except KeyboardInterrupt:
        raise _Interrupted(session.timings) from None
    return session.timings


class _Interrupted(KeyboardInterrupt):
    def __init__(self, timings: object) -> None:
        super().__init__()
        self.timings = timings


def _catch_ctrl_c() -> object:
    """Ctrl-C ends ``generate`` with the timings and status 130 even where the process started with SIGINT ignored
    (a background job of a script, some test runners), as llama.cpp's completion tool installs its handler
    unconditionally. Returns the handler it replaced (None: none replaced)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = command_parser(parser, args)  # its name prefixes every error: `samplechain generate: error: ...`
    run = {"serve": serve, "trace": trace}.get(args.command, generate)
    previous = _catch_ctrl_c() if run is generate else None
    try:
        return run(args, command)
    except (ValueError, FileNotFoundError) as e:
        print(f"{command.prog}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # before generation started (loading the model)
        print(file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(main())
