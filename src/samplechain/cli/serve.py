"""``samplechain serve``: llama-server's flags, the server (``server/app.py``) or, with ``--models-dir``,
``--models-preset`` or ``--router``, the router over many models (``server/router.py``)."""

from __future__ import annotations

import argparse
import os
import sys

from samplechain.cli.common import (
    add_model_arguments,
    add_sampling_arguments,
    add_spec_arguments,
    check_constraint,
    from_hub,
    params_from_args,
    speculation_config,
)
from samplechain.options import add_declared, declared_values
from samplechain.param_specs import read_text_file
from samplechain.params import SamplingParams
from samplechain.runtime.decoding import Rules
from samplechain.server.config import Defaults, ServerConfig
from samplechain.validate import cli_non_negative_int, cli_number, cli_positive_int


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    """``samplechain serve``: llama-server's flags that matter (common/arg.cpp declares them); the sampling flags become
    every request's defaults."""
    sv = sub.add_parser("serve", help="HTTP server: llama-server's and OpenAI's API, continuously batched",
                        allow_abbrev=False)  # as llama-server: router mode passes the flags on by their names
    o = sv.add_argument_group("server")
    add_model_arguments(o)
    add_declared(o, ServerConfig)  # ServerConfig's options and ModelOptions' (server/config.py, runtime/config.py)
    o.add_argument("-ub", "--ubatch-size", type=int, default=512, help=argparse.SUPPRESS)
    add_declared(o, Rules)  # -n, --keep, -r: every request's defaults (runtime/decoding.py)
    o.add_argument("-tb", "--threads-batch", type=int, default=None, help=argparse.SUPPRESS)
    o.add_argument("--threads-http", type=int, default=-1, help=argparse.SUPPRESS)
    o.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="gpu_layers", type=int, default=None,
                   help="accepted for llama.cpp compatibility: the whole model runs on --device")
    o.add_argument("--api-key", default=None, help="comma-separated API keys (also $LLAMA_API_KEY)")
    o.add_argument("--api-key-file", default=None, help="file with one API key per line (# comments)")
    o.add_argument("-cb", "--cont-batching", action="store_true", default=True,
                   help="continuous batching (always on)")
    o.add_argument("--chat-template", default=None,
                   help="chat template: a built-in name (chatml, llama3, gemma, mistral-v7, ...) or jinja source")
    o.add_argument("--chat-template-file", default=None, help="chat template (jinja source) read from a file")
    add_declared(o, Defaults)  # --cache-prompt, -v: every request's defaults (server/config.py)
    o.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"),
                   help="HTTP server log level")
    n = sv.add_argument_group("llama-server flags that mean nothing here (accepted, with a note)")
    n.add_argument("-fa", "--flash-attn", default=None, help="on|off|auto: the attention kernels are chosen by measure")
    n.add_argument("-cram", "--cache-ram", type=int, default=None, help="no host-memory prompt cache")
    n.add_argument("--cache-idle-slots", dest="cache_idle_slots", action="store_true", default=None,
                   help="idle slots keep their cells")
    n.add_argument("--no-cache-idle-slots", dest="cache_idle_slots", action="store_false")
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
    s = sv.add_argument_group("sampling: every request's defaults (llama.cpp's flags and defaults)")
    add_sampling_arguments(s)
    spec = sv.add_argument_group("speculative decoding per slot (n-gram drafters, a draft model; same text as "
                                 "without)")
    add_spec_arguments(spec)
    spec.add_argument("--spec-synth-rates", type=_rates, default=None, metavar="P0,P1,...",
                      help="benchmarking: draft position i is accepted at random with unconditional probability Pi "
                           "(one per --draft-max position, non-increasing) instead of by comparison")
    spec.add_argument("--spec-synth-len", type=cli_number, default=None, metavar="L",
                      help="benchmarking: geometric synthetic acceptance with mean acceptance length L (with the "
                           "target token)")
    # embeddings (llama-server's --embedding and --pooling; -md is with the speculative flags)
    m = sv.add_argument_group("router mode: many models behind one server, each in a serve process of its own "
                              "(docs/router.md)")
    m.add_argument("--router", action="store_true",
                   help="router mode over the models in the Hugging Face cache (with --models-dir / --models-preset: "
                        "theirs too)")
    m.add_argument("--models-dir", default=None, metavar="DIR",
                   help="router mode: each NAME.gguf (or folder) of DIR is a model")
    m.add_argument("--models-preset", default=None, metavar="FILE",
                   help="router mode: llama.cpp's INI presets (per-model serve flags; [*] for all)")
    m.add_argument("--models-max", type=cli_non_negative_int, default=4, metavar="N",
                   help="models running at once; the least recently used idle one makes room (0: no limit)")
    m.add_argument("--models-autoload", dest="models_autoload", action="store_true", default=True,
                   help="load a model a request names (default)")
    m.add_argument("--no-models-autoload", dest="models_autoload", action="store_false",
                   help="a request for a model not loaded is a 400 (POST /models/load loads it)")
    r = sv.add_argument_group("Ray Serve (samplechain.integrations.ray_serve; needs ray[serve])")
    r.add_argument("--ray", action="store_true",
                   help="serve as replicas on Ray Serve (a conversation stays on its replica's cache)")
    r.add_argument("--replicas", type=cli_positive_int, default=None, help="engine replicas with --ray (default 1)")
    r.add_argument("--ray-address", default=None,
                   help="Ray cluster to join with --ray (default: a local Ray on loopback)")


def _rates(value: str) -> list[float]:
    """``--spec-synth-rates``: comma-separated numbers (llama.cpp parses each whole, else "invalid value")."""
    try:
        return [float(v.strip()) for v in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {value!r}") from None


def _api_keys(args: argparse.Namespace) -> tuple[str, ...]:
    import os


    keys = [k for k in (args.api_key or os.environ.get("LLAMA_API_KEY", "")).split(",") if k]
    if args.api_key_file is not None:
        keys += [line.strip() for line in read_text_file(args.api_key_file, "API key file").splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]
    return tuple(keys)


def serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from samplechain.server.app import serve as run_server
    from samplechain.speculative.config import SynthError

    try:
        declared_values(args, ServerConfig)  # every declared check: a usage error before anything loads
        rules = Rules(**declared_values(args, Rules))
    except ValueError as e:
        parser.error(str(e))
    if not args.ray and (args.replicas is not None or args.ray_address is not None):
        parser.error("--replicas / --ray-address need --ray")
    template = args.chat_template
    if args.chat_template_file is not None:
        try:
            template = read_text_file(args.chat_template_file, "chat template file")
        except ValueError as e:
            parser.error(f"--chat-template-file: {e}")
    if template is not None:
        from samplechain.server.state import chat_template

        try:
            chat_template(None, template, args.use_jinja)
        except ValueError as e:
            parser.error(str(e))
    if args.flash_attn is not None and args.flash_attn not in ("on", "off", "auto", "enabled", "disabled", "true",
                                                               "false", "1", "0"):
        parser.error(f"-fa/--flash-attn: unknown value {args.flash_attn!r} (on, off or auto)")
    for given, feature in ((args.lora, "LoRA adapters (--lora)"), (args.reranking, "reranking (--reranking)")):
        if given:
            parser.error(f"{feature}: not provided by samplechain serve")
    notes = [(args.tools is not None or args.tools_runtime is not None,
              "--tools: the web UI's built-in agent tools are not provided (OpenAI tool calls are)"),
             (args.ui_mcp_proxy or args.mcp_servers is not None, "--ui-mcp-proxy / --mcp-servers-*: no MCP proxy"),
             (args.media_path is not None or args.mmproj is not None or args.no_mmproj,
              "--media-path / --mmproj / --no-mmproj: no multimodal input here (image parts are a 400)"),
             (args.flash_attn is not None, "-fa: the attention kernels are chosen by measurement"),
             (args.cache_ram is not None or args.cache_idle_slots is not None,
              "--cache-ram / --cache-idle-slots: each slot keeps its prompt in its own cells; no host-memory cache"),
             (args.swa_full, "--swa-full: sliding-window layers keep every cell already"),
             (args.grp_attn_n is not None or args.grp_attn_w is not None,
              "--grp-attn-n / --grp-attn-w: no group attention here (llama-server ignores it too)")]
    for given, note in notes:
        if given:
            print(f"note: {note}", file=sys.stderr)
    remote = None
    if args.hf_repo is not None and args.models_preset is None and not args.router and args.models_dir is None:
        from samplechain.runtime.hub import preset_file

        remote = preset_file(args.hf_repo, token=args.hf_token, offline=args.offline)  # a preset repo: a router
        if remote is not None:
            print(f"note: using preset.ini from Hugging Face repo {args.hf_repo} (router mode)", file=sys.stderr)
            args.models_preset, args.hf_repo = remote, None
    if args.router or args.models_dir is not None or args.models_preset is not None:
        if args.model is not None or args.hf_repo is not None:
            parser.error("--router / --models-dir / --models-preset start a router over many models: without -m "
                         "or -hf")
        if args.ray:
            parser.error("router mode runs on one machine: without --ray")
        return serve_router(args, parser, remote=remote is not None)
    if args.models_max != 4 or not args.models_autoload:
        parser.error("--models-max / --no-models-autoload are router mode's (--router, --models-dir or "
                     "--models-preset)")
    from samplechain.runtime.generation import model_path, resolve_device

    from_hub(args)
    model_path(args.model)  # a missing model or device is one line now, not a server that cannot load
    resolve_device(args.device)
    params = params_from_args(args)
    check_constraint(params)
    defaults = Defaults(params=params, rules=rules, **declared_values(args, Defaults))
    # embeddings and the draft model (--embedding, --pooling, -md with --spec-type draft-simple)
    declared_options = declared_values(args, ServerConfig)  # again: -hf names the model's alias (runtime/hub.py)
    n_batch = declared_options["n_batch"]
    if args.embedding and n_batch > args.ubatch_size > 0:  # llama-server: a prompt to embed fits in one ubatch
        print(f"warning: embeddings enabled with n_batch ({n_batch}) > n_ubatch ({args.ubatch_size}): setting "
              f"n_batch = n_ubatch = {args.ubatch_size}", file=sys.stderr)
        n_batch = args.ubatch_size
    try:  # bad drafter names and lengths are errors now, not at the first request; bad synthetic rates, usage errors
        spec = speculation_config(args)
    except SynthError as e:
        parser.error(str(e))
    drafting = spec.draft_model
    if drafting and args.model_draft is None:
        parser.error("--spec-type draft-simple needs a draft model (-md)")
    if args.model_draft is not None and not drafting:
        print("note: -md is used only with --spec-type draft-simple", file=sys.stderr)
    if drafting:
        model_path(args.model_draft)

    config = ServerConfig(
        speculation=spec if spec.names else None,
        model_draft=args.model_draft if drafting else None,
        draft_params=spec.draft_params(),
        **{**declared_options, "n_batch": n_batch}, model=args.model, api_keys=_api_keys(args),
        chat_template=template, defaults=defaults)
    if args.ray:
        from samplechain.integrations.ray_serve import serve_ray

        return serve_ray(config, args.replicas or 1, args.ray_address, args.log_level)
    return run_server(config, log_level="debug" if args.verbose else args.log_level)


# the flags the router sets for each child itself (or that only the router reads), with their values
ROUTER_FLAGS = ("-m", "--model", "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-hft", "--hf-token", "--host",
                "--port", "--api-key",
                "--api-key-file", "-a", "--alias", "--tags", "--router", "--models-dir", "--models-preset",
                "--models-max", "--models-autoload", "--no-models-autoload", "--ray", "--replicas", "--ray-address")


def child_args(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """The router's own ``serve`` flags, as given, less those it sets for each child itself (``ROUTER_FLAGS``):
    every model's child gets them after its preset's (so they win, as llama-server's command line does)."""
    actions = parser._option_string_actions
    shorts = sorted((o for o in actions if not o.startswith("--") and actions[o].nargs != 0), key=len, reverse=True)
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = parser.dashed(argv[i]) if hasattr(parser, "dashed") else argv[i]
        name, eq, _ = arg.partition("=")
        if name not in actions and name.startswith("-") and not name.startswith("--"):  # -mFILE: a value attached
            name = next((o for o in shorts if name.startswith(o)), name)
            eq = "=" if name != arg else eq
        action = actions.get(name)
        takes = action is not None and action.nargs != 0 and not eq
        if name not in ROUTER_FLAGS:
            out += argv[i:i + 1 + takes]
        i += 1 + takes
    return out


def preset_flags(parser: argparse.ArgumentParser) -> object:
    """An INI preset's ``key = value`` as ``serve`` flags: the key is a flag without its dashes (``c``,
    ``ctx-size``); a switch takes true/false (false: its ``no-`` form, else nothing). ValueError for a key that is
    no flag of serve's."""
    actions = parser._option_string_actions

    def flags(key: str, value: str) -> list[str]:
        for name in (f"--{key}", f"-{key}"):
            action = actions.get(name)
            if action is None:
                continue
            if action.nargs == 0:
                on = value.strip().lower() in ("1", "true", "on", "yes", "enabled", "")
                if on:
                    return [name]
                negative = next((n for n in (f"--no-{key}", f"-no-{key}") if n in actions), None)
                return [negative] if negative is not None else []
            return [name, value]
        raise ValueError(f"option '{key}' is not a flag of samplechain serve")

    return flags


def serve_router(args: argparse.Namespace, parser: argparse.ArgumentParser, remote: bool = False) -> int:
    """Router mode (``server/router.py``): this command's flags become every child's, less the router's own.
    ``remote``: the preset came from a hub repo (only llama.cpp's remote-preset keys and sampling flags)."""
    from samplechain.server.router import Models, RouterConfig
    from samplechain.server.router_app import serve_router as run_router

    if args.models_dir is not None and not os.path.isdir(args.models_dir):
        parser.error(f"--models-dir: {args.models_dir!r} does not exist or is not a directory")
    if args.models_preset is not None and not os.path.isfile(args.models_preset):
        parser.error(f"--models-preset: no such file {args.models_preset!r}")
    server = ServerConfig(host=args.host, port=args.port, api_keys=_api_keys(args), cors_origins=args.cors_origins,
                          cors_methods=args.cors_methods, cors_headers=args.cors_headers,
                          cors_credentials=args.cors_credentials, timeout=args.timeout,
                          shutdown_grace=args.shutdown_grace, ui=False)
    config = RouterConfig(server=server, models_dir=args.models_dir, models_preset=args.models_preset,
                          models_max=args.models_max, autoload=args.models_autoload,
                          child_args=tuple(child_args(parser, getattr(args, "argv", []))),
                          child_env={"HF_TOKEN": args.hf_token} if args.hf_token else {},
                          flags=preset_flags(parser), preset_keys=remote_preset_keys(parser) if remote else None)
    Models(config)  # a bad preset is a one-line error (ValueError) here, not a router that fails after listening
    return run_router(config, log_level="debug" if args.verbose else args.log_level)


def remote_preset_keys(parser: argparse.ArgumentParser) -> frozenset[str]:
    """What a preset from a hub repo may set: llama.cpp's list (``hub.REMOTE_PRESET_KEYS``) and the sampling flags,
    each by any of its names (``hf``, ``hfr`` as ``hf-repo``), and the preset-only keys."""
    from samplechain.param_specs import declarations
    from samplechain.runtime.hub import REMOTE_PRESET_KEYS
    from samplechain.server.router_models import PRESET_ONLY

    sampling = {n.lstrip("-") for d in declarations(SamplingParams) for f in d.cli for n in f.names}
    allowed = REMOTE_PRESET_KEYS | sampling
    names = {n.lstrip("-") for a in parser._actions for n in a.option_strings
             if any(o.lstrip("-") in allowed for o in a.option_strings)}
    return frozenset(allowed | names | set(PRESET_ONLY))
