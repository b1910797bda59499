"""``samplechain generate`` (llama.cpp's completion tool: one prompt, a conversation, interactive mode) and
``samplechain trace`` (the chain's stages for the next tokens)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import threading
from collections.abc import Iterable, Sequence

from samplechain.cli.common import (
    add_model_arguments,
    add_sampling_arguments,
    from_hub,
    load_model,
    resolve_seed,
    sampling_params,
    speculation_from_args,
)
from samplechain.options import add_declared, declared_values
from samplechain.param_specs import read_text_file
from samplechain.param_specs import unescape as _unescape
from samplechain.params import SamplingParams
from samplechain.runtime.config import ModelOptions
from samplechain.runtime.decoding import Rules


def add_trace_parser(sub: argparse._SubParsersAction) -> None:
    """``samplechain trace``: the candidates after each stage of the chain for the next token(s), as tables."""
    tr = sub.add_parser("trace", help="show how each sampler of the chain reshapes the next token's distribution")
    io = tr.add_argument_group("model and prompt")
    add_model_arguments(io)
    io.add_argument("-p", "--prompt", required=True, help="prompt text")
    io.add_argument("--chat", action="store_true", help="apply the model's chat template to the prompt")
    io.add_argument("--n-top", type=int, default=10, help="candidates shown per stage (default 10)")
    io.add_argument("--steps", type=int, default=1,
                    help="tokens traced, each appended before the next is traced (default 1)")
    io.add_argument("--json", action="store_true", help="print the trace as JSON (the /sampling/trace body)")
    add_declared(io, ModelOptions, skip=("n_ctx", "n_batch"))
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
    params = sampling_params(args, parser)
    prompt = _unescape(args.prompt) if args.escape else args.prompt
    from samplechain.runtime.chat import starts_with_bos

    from_hub(args)
    model = load_model(args.model, args)
    text = model.apply_chat_template(prompt) if args.chat else prompt
    tokens = model.tokenize(text, add_special=not args.chat or not starts_with_bos(model.vocab, text))
    if not tokens:
        parser.error("the prompt is empty")
    result = run_trace(model, tokens, params, n_top=args.n_top, steps=args.steps)
    print(json.dumps(result.to_dict(), ensure_ascii=False) if args.json else format_trace(result))
    return 0


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
    try:  # -n, --keep, -r (runtime/decoding.py) and how the model loads (runtime/config.py): usage errors
        for cls in (Rules, ModelOptions):
            declared_values(args, cls)
    except ValueError as e:
        parser.error(str(e))
    params = sampling_params(args, parser)
    params = resolve_seed(params, args)

    if (args.conversation or args.interactive) and args.prompt_cache is not None:
        parser.error("--prompt-cache is not supported with -cnv/-i")
    if args.prompt_cache is not None:
        folder = os.path.dirname(os.path.abspath(args.prompt_cache))
        if not os.path.isdir(folder):
            parser.error(f"--prompt-cache: the folder {folder} does not exist")
        if os.path.isdir(args.prompt_cache):
            parser.error(f"--prompt-cache: {args.prompt_cache} is a folder, not a file")
    from_hub(args)
    model = load_model(args.model, args)
    if args.gpu_layers is not None and model.transformer.device.type == "cpu":
        print(f"note: -ngl {args.gpu_layers} is ignored: the whole model runs on the cpu (--device cuda for a GPU)",
              file=sys.stderr)
    n_ctx = args.n_ctx or model.config.n_ctx_train
    ctx = model.new_context(n_ctx, n_batch=args.n_batch)
    chat = args.chat or args.conversation
    # the text as llama.cpp's completion tool feeds it (a chat turn is tokenized with its template, later)
    tokens = None if chat else model.tokenize(prompt)
    speculation = speculation_from_args(args, model)
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
                                   n_keep=args.n_keep, context_shift=args.context_shift,
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
    print(f"generate: n_ctx = {n_ctx}, n_batch = {args.n_batch}, n_predict = {args.n_predict}, "
          f"n_keep = {args.n_keep}\n", file=sys.stderr)
    if sys.stdin.isatty() and (args.conversation or args.interactive):
        print(f"{'conversation' if args.conversation else 'interactive'} mode: type a line and press Return; "
              f"{'/exit or ' if args.conversation else ''}Ctrl-D to leave, Ctrl-C to stop at once\n", file=sys.stderr)


def _pieces(model: object, tokens: Sequence[int]) -> str:
    """Tokens as llama.cpp's completion tool displays them: each token's piece, special tokens as nothing."""
    piece = model.vocab.piece  # type: ignore[attr-defined]
    return b"".join(piece(t) for t in tokens).decode("utf-8", "replace")


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
                          context_shift=args.context_shift, reverse_prompts=args.stop, context=ctx,
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


def catch_ctrl_c() -> object:
    """Ctrl-C ends ``generate`` with the timings and status 130 even where the process started with SIGINT ignored
    (a background job of a script, some test runners), as llama.cpp's completion tool installs its handler
    unconditionally. Returns the handler it replaced (None: none replaced)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, signal.default_int_handler)
