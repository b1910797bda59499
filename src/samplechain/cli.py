"""The ``samplechain`` command: ``samplechain generate`` with llama.cpp's flag names and defaults."""

from __future__ import annotations

import argparse
import codecs
import re
import sys
from collections.abc import Iterable, Sequence
from typing import NoReturn

from samplechain.params import DEFAULT_SEQ_BREAKERS, SamplingParams, parse_sampler_chars, parse_sampler_names
from samplechain.rng import DEFAULT_SEED


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (the message, where to find the usage) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (usage: {self.prog} --help)\n")


def _unsigned_seed(text: str) -> int:
    value = int(text, 0)
    if value < -(2**31) or value >= 2**32:
        raise argparse.ArgumentTypeError(f"seed {text} is out of range")
    return value & 0xFFFFFFFF


def _number(text: str) -> float:
    """A float flag value; NaN is refused (the Python API refuses it too)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value:
        raise argparse.ArgumentTypeError("must be a number, got nan")
    return value


def _budget(text: str) -> int:
    value = int(text)
    if value < -1:
        raise argparse.ArgumentTypeError(f"must be -1 (no limit) or more, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _logit_bias(text: str) -> tuple[int, float]:
    m = re.fullmatch(r"\s*(\d+)\s*([+-]\s*(?:inf|[0-9.eE+-]+))\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected TOKEN_ID(+/-)BIAS, e.g. 15043+1, got {text!r}")
    return int(m.group(1)), float(m.group(2).replace(" ", ""))


def _unescape(text: str) -> str:
    return codecs.decode(text.encode("utf-8", "backslashreplace"), "unicode_escape") if "\\" in text else text


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="samplechain", description="llama.cpp's token sampling, rebuilt in Python")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    g = sub.add_parser("generate", help="generate text from a prompt (llama.cpp's completion flags)")
    io = g.add_argument_group("model and prompt")
    io.add_argument("-m", "--model", default=None,
                    help="GGUF file, or a packaged model: smollm2 (default), gemma3-270m")
    io.add_argument("-p", "--prompt", default=None, help="prompt text")
    io.add_argument("-f", "--file", default=None, help="read the prompt from a file")
    io.add_argument("-n", "--n-predict", "--predict", type=int, default=-1,
                    help="tokens to generate (-1 = until end of generation or the context limit)")
    io.add_argument("-c", "--ctx-size", type=_non_negative_int, default=4096, help="context size (0 = model's)")
    io.add_argument("-b", "--batch-size", type=int, default=512, help="prompt tokens per forward")
    io.add_argument("-t", "--threads", type=int, default=None, help="CPU threads")
    io.add_argument("--keep", type=int, default=0, help="tokens of the prompt kept on context shift (-1 = all)")
    io.add_argument("--context-shift", dest="context_shift", action="store_true", default=True,
                    help="shift the context when it is full (default)")
    io.add_argument("--no-context-shift", dest="context_shift", action="store_false")
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
    io.add_argument("--n-probs", type=_non_negative_int, default=0,
                    help="print each generated token's top N post-sampling probabilities (to stderr)")
    io.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="gpu_layers", type=int, default=None,
                    help="accepted for llama.cpp compatibility: the whole model runs on --device")
    io.add_argument("--device", default="cpu", help="torch device: cpu or cuda")
    io.add_argument("--kernel", default=None,
                    help="CPU forward kernel (default: the fastest measured on this machine; see kernels.py)")
    io.add_argument("--escape", dest="escape", action="store_true", default=True,
                    help="process escapes (\\n, \\t, ...) in the prompt (default)")
    io.add_argument("--no-escape", dest="escape", action="store_false")
    io.add_argument("--verbose-prompt", action="store_true", help="print the prompt's tokens to stderr")

    s = g.add_argument_group("sampling (llama.cpp's flags and defaults)")
    d = SamplingParams()
    s.add_argument("--samplers", default=None, help=f"';'-separated sampler names (default {';'.join(d.samplers)})")
    s.add_argument("--sampler-seq", "--sampling-seq", dest="sampler_seq", default=None,
                   help="samplers as one letter each (default edskypmxt)")
    s.add_argument("-s", "--seed", type=_unsigned_seed, default=DEFAULT_SEED, help="RNG seed (-1 = random)")
    s.add_argument("--ignore-eos", action="store_true", help="never stop at end-of-generation tokens")
    s.add_argument("--temp", "--temperature", dest="temp", type=_number, default=d.temperature)
    s.add_argument("--top-k", type=int, default=d.top_k)
    s.add_argument("--top-p", type=_number, default=d.top_p)
    s.add_argument("--min-p", type=_number, default=d.min_p)
    s.add_argument("--top-nsigma", "--top-n-sigma", dest="top_n_sigma", type=_number, default=d.top_n_sigma)
    s.add_argument("--xtc-probability", type=_number, default=d.xtc_probability)
    s.add_argument("--xtc-threshold", type=_number, default=d.xtc_threshold)
    s.add_argument("--typical", "--typical-p", dest="typical", type=_number, default=d.typical_p)
    s.add_argument("--repeat-last-n", type=int, default=d.repeat_last_n)
    s.add_argument("--repeat-penalty", type=_number, default=d.repeat_penalty)
    s.add_argument("--presence-penalty", type=_number, default=d.presence_penalty)
    s.add_argument("--frequency-penalty", type=_number, default=d.frequency_penalty)
    s.add_argument("--dry-multiplier", type=_number, default=d.dry_multiplier)
    s.add_argument("--dry-base", type=_number, default=d.dry_base)
    s.add_argument("--dry-allowed-length", type=int, default=d.dry_allowed_length)
    s.add_argument("--dry-penalty-last-n", type=int, default=d.dry_penalty_last_n)
    s.add_argument("--dry-sequence-breaker", action="append", default=None,
                   help="repeatable; the first use replaces the defaults; 'none' clears them")
    s.add_argument("--adaptive-target", type=_number, default=d.adaptive_target)
    s.add_argument("--adaptive-decay", type=_number, default=d.adaptive_decay)
    s.add_argument("--dynatemp-range", type=_number, default=d.dynatemp_range)
    s.add_argument("--dynatemp-exp", type=_number, default=d.dynatemp_exponent)
    s.add_argument("--mirostat", type=int, choices=(0, 1, 2), default=d.mirostat)
    s.add_argument("--mirostat-lr", type=_number, default=d.mirostat_eta)
    s.add_argument("--mirostat-ent", type=_number, default=d.mirostat_tau)
    s.add_argument("-l", "--logit-bias", type=_logit_bias, action="append", default=[])
    s.add_argument("-bs", "--backend-sampling", action="store_true",
                   help="run the chain's leading samplers on the model's device (the final draw on the CPU)")
    s.add_argument("--backend-dist", action="store_true",
                   help="with backend sampling, draw the token on the device too (implies --backend-sampling)")
    s.add_argument("--reasoning-budget", type=_budget, default=-1,
                   help="tokens allowed inside a <think> ... </think> block (-1 = no limit, 0 = none)")
    s.add_argument("--reasoning-budget-message", default="",
                   help="text forced before </think> when the reasoning budget is spent")
    s.add_argument("--perf", dest="perf", action="store_true", default=True, help="print timings (default)")
    s.add_argument("--no-perf", dest="perf", action="store_false")
    sp = g.add_argument_group("speculative decoding (llama.cpp's flags; the text is the same with or without)")
    sp.add_argument("--spec-type", action="append", default=[],
                    help="comma-separated drafters: ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, "
                         "ngram-cache, draft-simple (with -md), none; repeatable")
    sp.add_argument("--spec-default", action="store_true", help="ngram-mod with n-match 24, n-min 48, n-max 64")
    sp.add_argument("-md", "--model-draft", default=None, help="draft model GGUF (used by --spec-type draft-simple)")
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
    c = g.add_argument_group("constrained output")
    c.add_argument("--grammar", default=None, help="GBNF grammar the output must follow")
    c.add_argument("--grammar-file", default=None, help="read the GBNF grammar from a file")
    c.add_argument("-j", "--json-schema", default=None,
                   help='JSON Schema the output must follow, e.g. \'{"type": "object"}\' ({} = any JSON value)')
    c.add_argument("-jf", "--json-schema-file", default=None, help="read the JSON Schema from a file")
    return parser


def _read(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"cannot read {what} {path}: {e.strerror}") from None


def _constraint(args: argparse.Namespace) -> dict:
    """``grammar`` / ``json_schema`` from the four flags (at most one of them)."""
    given = [(flag, v) for flag, v in (("--grammar", args.grammar), ("--grammar-file", args.grammar_file),
                                       ("--json-schema", args.json_schema),
                                       ("--json-schema-file", args.json_schema_file)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"use only one of {', '.join(f for f, _ in given)}")
    if args.grammar is not None:
        return {"grammar": args.grammar}
    if args.grammar_file is not None:
        return {"grammar": _read(args.grammar_file, "grammar file")}
    if args.json_schema is not None:
        return {"json_schema": args.json_schema}
    if args.json_schema_file is not None:
        return {"json_schema": _read(args.json_schema_file, "JSON schema file")}
    return {}


def params_from_args(args: argparse.Namespace) -> SamplingParams:
    """The flags as ``SamplingParams`` (ValueError on invalid values, as the params validate them)."""
    breakers = DEFAULT_SEQ_BREAKERS
    if args.dry_sequence_breaker is not None:
        given = [_unescape(b) for b in args.dry_sequence_breaker]
        breakers = () if given == ["none"] else tuple(given)
    if args.repeat_last_n < 0:
        raise ValueError(f"--repeat-last-n must be >= 0, got {args.repeat_last_n}")
    if args.dry_penalty_last_n < 0:
        raise ValueError(f"--dry-penalty-last-n must be >= 0, got {args.dry_penalty_last_n}")
    samplers = SamplingParams().samplers
    if args.samplers is not None:
        samplers = parse_sampler_names(args.samplers)
    elif args.sampler_seq is not None:
        samplers = parse_sampler_chars(args.sampler_seq)
    return SamplingParams(
        seed=args.seed, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, top_n_sigma=args.top_n_sigma,
        xtc_probability=args.xtc_probability, xtc_threshold=args.xtc_threshold, typical_p=args.typical,
        temperature=max(0.0, args.temp), dynatemp_range=args.dynatemp_range,
        dynatemp_exponent=args.dynatemp_exp, repeat_last_n=args.repeat_last_n,
        n_prev=max(64, args.repeat_last_n), repeat_penalty=args.repeat_penalty,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
        dry_multiplier=args.dry_multiplier, dry_base=args.dry_base, dry_allowed_length=args.dry_allowed_length,
        dry_penalty_last_n=args.dry_penalty_last_n, dry_sequence_breakers=breakers,
        adaptive_target=args.adaptive_target, adaptive_decay=args.adaptive_decay, mirostat=args.mirostat,
        mirostat_eta=args.mirostat_lr, mirostat_tau=args.mirostat_ent, ignore_eos=args.ignore_eos,
        no_perf=not args.perf, backend_sampling=args.backend_sampling or args.backend_dist,
        backend_dist=args.backend_dist, samplers=samplers, logit_bias=tuple(args.logit_bias), **_constraint(args),
        **_reasoning(args),
    )


def _reasoning(args: argparse.Namespace) -> dict:
    """The reasoning budget for thinking models' <think> ... </think> blocks (llama.cpp takes the tags from the chat
    template's thinking markers; these are the common ones)."""
    if args.reasoning_budget < 0 and not args.reasoning_budget_message:
        return {}
    return {"reasoning_budget_tokens": args.reasoning_budget, "reasoning_budget_message": args.reasoning_budget_message,
            "reasoning_budget_start_tag": "<think>", "reasoning_budget_end_tags": ("</think>",)}


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
            with open(args.file, encoding="utf-8") as f:
                prompt = f.read()
        except OSError as e:
            parser.error(f"cannot read prompt file {args.file}: {e.strerror}")
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

    if (args.conversation or args.interactive) and args.prompt_cache is not None:
        parser.error("--prompt-cache is not supported with -cnv/-i")
    from samplechain.runtime import load_model

    model = load_model(args.model, device=args.device, n_threads=args.threads, kernel=args.kernel)
    if args.gpu_layers is not None and model.transformer.device.type == "cpu":
        print(f"note: -ngl {args.gpu_layers} is ignored: the whole model runs on the cpu (--device cuda for a GPU)",
              file=sys.stderr)
    n_ctx = args.ctx_size or model.config.n_ctx_train
    ctx = model.new_context(n_ctx, n_batch=max(1, args.batch_size))
    if args.verbose_prompt:
        print(f"prompt tokens: {model.tokenize(prompt)}", file=sys.stderr)
    probs: list[tuple[int, list[tuple[int, float]]]] = []
    if args.n_probs:
        model.on_token = lambda token, sampler: probs.append((token, sampler.top_probs(args.n_probs)))
    timings = model.timings
    speculation = _speculation(args, model)
    try:
        if args.conversation or args.interactive:
            timings = _interactive(model, params, args, prompt, ctx, probs)
        else:
            _stream(model.generate(prompt, params, args.n_predict, chat=args.chat, n_keep=args.keep,
                                   context_shift=args.context_shift, prompt_cache=args.prompt_cache,
                                   prompt_cache_ro=args.prompt_cache_ro, context=ctx, speculation=speculation))
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


def _spec_types(args: argparse.Namespace) -> list[str]:
    types = [t for value in args.spec_type for t in ([value] if "none" not in value.split(",") else [])]
    if args.spec_default:
        types.append("ngram-mod")
    return types


def _speculation(args: argparse.Namespace, model: object) -> object | None:
    """The drafters the flags ask for (llama.cpp: a draft model is used only with --spec-type draft-simple)."""
    from samplechain.runtime.speculation import Speculation
    from samplechain.speculative.ngram import make_drafters

    types = _spec_types(args)
    names = {t.strip() for value in types for t in value.split(",")}
    if args.model_draft is not None and "draft-simple" not in names:
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
    if "draft-simple" in names:
        if args.model_draft is None:
            raise ValueError("--spec-type draft-simple needs a draft model (-md)")
        from samplechain.runtime import load_model
        from samplechain.speculative.draft_model import DraftModel

        draft = load_model(args.model_draft, device=args.device, n_threads=args.threads)
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
                 probs: list) -> object:
    """llama-cli's conversation (-cnv) and interactive (-i) modes: turns read from stdin until end of input."""
    from samplechain.runtime.chat import ChatSession

    session = ChatSession(model, params, system_prompt=args.system_prompt, n_predict=args.n_predict,
                          context_shift=args.context_shift, reverse_prompts=args.reverse_prompt, context=ctx,
                          template=args.conversation)
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
            if not line:  # end of input
                break
            line = line.rstrip("\n")
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return generate(args, parser)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # before generation started (loading the model)
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
