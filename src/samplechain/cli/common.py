"""What the ``samplechain`` subcommands share: the argument parser (llama.cpp's flag names, one-line usage errors), the
sampling, Hugging Face and speculative flags, and loading the model they name."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from samplechain.options import add_declared, declared_values
from samplechain.param_specs import declarations, flag_help
from samplechain.params import SamplingParams
from samplechain.runtime.config import ModelOptions
from samplechain.validate import cli_budget, cli_number, cli_seed


class _HelpFormatter(argparse.HelpFormatter):
    """Each flag's default after its meaning, unless the meaning already says it (the sampling flags' help is
    generated with theirs) or there is nothing to show (switches, empty values)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if not text or "(default" in text or not action.option_strings or action.default in (None, "", []) \
                or isinstance(action.default, bool) or action.default is argparse.SUPPRESS:
            return text
        return text + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
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
            args = [self.dashed(a) for a in args]
        return super().parse_known_args(args, namespace)

    def dashed(self, arg: str) -> str:
        """``arg`` with a long flag's underscores read as dashes, when only that spelling is a flag here."""
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


_NUMBERS = (int, cli_number, cli_seed, cli_budget)  # their values read as N in --help, as llama.cpp's


def params_from_args(args: argparse.Namespace, *,
                     params_type: type[SamplingParams] = SamplingParams) -> SamplingParams:
    """The flags added by :func:`add_sampling_arguments` as ``SamplingParams`` (ValueError on invalid values)."""
    constraints = [f for d in declarations(params_type) for f in d.cli if f.group == "constraints"]
    given = [next(n for n in f.names if n.startswith("--")) for f in constraints if getattr(args, f.dest) is not None]
    if len(given) > 1:
        raise ValueError(f"use only one of {', '.join(given)}")
    return params_type(**{d.name: d.value_from_args(args) for d in declarations(params_type)
                          if d.cli or d.from_args is not None})


def add_model_arguments(group: argparse._ArgumentGroup) -> None:
    """The model: ``-m`` (a file or a packaged model) or llama.cpp's Hugging Face flags (``common/arg.cpp``; what
    they do: ``runtime/hub.py``, imported only when used)."""
    group.add_argument("-m", "--model", default=None,
                       help="GGUF file, or a packaged model: smollm2 (default), gemma3-270m")
    group.add_argument("-hf", "-hfr", "--hf-repo", dest="hf_repo", default=None, metavar="USER/REPO[:QUANT]",
                       help="GGUF model from a Hugging Face repo, downloaded once into the hub cache: the quant is "
                            "case-insensitive, default Q4_K_M, else Q8_0, else the repo's first GGUF")
    group.add_argument("-hff", "--hf-file", dest="hf_file", default=None, metavar="FILE",
                       help="this file of the -hf repo (the quant is then not used)")
    group.add_argument("-hft", "--hf-token", dest="hf_token", default=None, metavar="TOKEN",
                       help="Hugging Face access token (default: $HF_TOKEN, or the token huggingface_hub stored)")
    group.add_argument("--offline", action="store_true",
                       help="-hf from the hub cache only: nothing is downloaded (as HF_HUB_OFFLINE=1)")


def add_spec_arguments(sp: argparse._ArgumentGroup) -> None:
    """llama.cpp's speculative decoding flags (``generate`` and ``serve``)."""
    from samplechain.speculative.config import SpeculationConfig

    add_declared(sp, SpeculationConfig)  # --spec-type, --draft-max/min, --draft-p-min, --spec-verify, adaptive
    sp.add_argument("--spec-default", action="store_true", help="ngram-mod with n-match 24, n-min 48, n-max 64")
    sp.add_argument("-md", "--model-draft", "--spec-draft-model", dest="model_draft", default=None,
                    help="draft model GGUF (used by --spec-type draft-simple); with -hfd, the file of that repo")
    sp.add_argument("-hfd", "-hfrd", "--hf-repo-draft", "--spec-draft-hf", dest="hf_repo_draft", default=None,
                    metavar="USER/REPO[:QUANT]", help="draft model from a Hugging Face repo, as -hf")
    from samplechain.speculative.ngram.factory import NGRAM_PARAMS

    for key, (default, lo, _, flag) in NGRAM_PARAMS.items():  # the n-gram sizes, declared where they are checked
        if lo is not None:
            sp.add_argument(flag, dest=key, type=int, default=default, help=argparse.SUPPRESS)
    sp.add_argument("-lcs", "--lookup-cache-static", default=None, help="ngram-cache: static n-gram statistics")
    sp.add_argument("-lcd", "--lookup-cache-dynamic", default=None, help="ngram-cache: dynamic n-gram statistics")


def sampling_params(args: argparse.Namespace, parser: argparse.ArgumentParser) -> SamplingParams:
    """The sampling flags as ``SamplingParams``, the grammar or schema checked: a bad value is a usage error."""
    try:
        params = params_from_args(args)
        check_constraint(params)
    except ValueError as e:
        parser.error(str(e))
    return params


def check_constraint(params: SamplingParams) -> None:
    """Refuse a bad grammar or schema before the model loads (token items are resolved later, with the model)."""
    from samplechain.grammar import Grammar, json_schema_to_gbnf, parse_gbnf

    text = json_schema_to_gbnf(params.json_schema) if params.json_schema is not None else params.grammar
    if text.strip():
        Grammar(parse_gbnf(text, tokenize=lambda _: [0]))


def from_hub(args: argparse.Namespace) -> None:
    """-hf / -hfd: ``args.model`` / ``args.model_draft`` become the files they name, downloaded into the hub cache
    or found there (runtime/hub.py: llama.cpp's choice of file, one-line errors)."""
    if args.hf_repo or args.hf_file or getattr(args, "hf_repo_draft", None):
        from samplechain.runtime.hub import resolve_model_args

        resolve_model_args(args)


def load_model(name: str | None, args: argparse.Namespace) -> object:
    """``load_model`` with the ``ModelOptions`` flags (``add_declared(group, ModelOptions)``), said first on stderr
    (a large model takes seconds); a missing model or device, or a bad option, is refused before that, in one
    line."""
    from samplechain.runtime import load_model
    from samplechain.runtime.generation import model_path, resolve_device

    options = ModelOptions(**declared_values(args, ModelOptions, skip=("n_ctx", "n_batch")))  # the loading's
    path = model_path(name)
    resolve_device(options.device)
    print(f"loading model {path} ...", file=sys.stderr, flush=True)
    return load_model(path, **options.load_options())


def spec_types(args: argparse.Namespace) -> list[str]:
    types = [t for value in args.types for t in ([value] if "none" not in value.split(",") else [])]
    if args.spec_default:
        types.append("ngram-mod")
    return types


def speculation_config(args: argparse.Namespace) -> Any:
    """The speculative flags as one ``SpeculationConfig`` (``speculative/config.py``); ValueError for a bad value."""
    from samplechain.speculative.config import SPEC_DEFAULT, SpeculationConfig
    from samplechain.speculative.ngram.factory import NGRAM_PARAMS

    ngram = {key: getattr(args, key) for key, (_, lo, _, _) in NGRAM_PARAMS.items() if lo is not None}
    if args.spec_default:
        ngram.update(SPEC_DEFAULT)
    ngram.update(lookup_cache_static=args.lookup_cache_static, lookup_cache_dynamic=args.lookup_cache_dynamic)
    declared = {**declared_values(args, SpeculationConfig), "types": tuple(spec_types(args))}
    return SpeculationConfig(**declared, seed=args.seed, ngram=ngram,
                             synth_rates=getattr(args, "spec_synth_rates", None),
                             synth_len=getattr(args, "spec_synth_len", None))


def speculation_from_args(args: argparse.Namespace, model: object) -> object | None:
    """``generate``'s drafting: the flags' drafters, and the draft model (``-md``) with ``--spec-type
    draft-simple`` (llama.cpp uses a draft model only then)."""
    config = speculation_config(args)
    if args.model_draft is not None and not config.draft_model:
        print("note: -md is used only with --spec-type draft-simple", file=sys.stderr)
    draft = None
    if config.draft_model:
        if args.model_draft is None:
            raise ValueError("--spec-type draft-simple needs a draft model (-md)")
        from samplechain.speculative.draft_model import DraftModel

        draft = DraftModel(load_model(args.model_draft, args), model.vocab,  # type: ignore[attr-defined]
                           **config.draft_params(), n_ctx=args.n_ctx or 4096)
    return config.build(draft)


def resolve_seed(params: SamplingParams, args: argparse.Namespace) -> SamplingParams:
    """A random seed (-1) drawn now, as llama.cpp's samplers draw it, so that it can be printed and the run
    repeated with ``--seed N``; every seeded sampler and the drafter then use it."""
    from samplechain.rng import resolve_seed

    args.seed = resolve_seed(params.seed)
    return dataclasses.replace(params, seed=args.seed)
