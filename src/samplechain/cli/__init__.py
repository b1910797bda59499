"""The ``samplechain`` command: ``generate``, ``serve`` and ``trace``, with llama.cpp's flag names and defaults
(``common``: the parser and the shared flags; ``run``: generate and trace; ``serve``: the server and the router)."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

from samplechain.cli.common import (
    Parser,
    add_model_arguments,
    add_sampling_arguments,
    add_spec_arguments,
    command_parser,
)
from samplechain.cli.run import add_trace_parser, catch_ctrl_c, generate, trace
from samplechain.cli.serve import add_serve_parser, serve
from samplechain.options import add_declared
from samplechain.runtime.config import ModelOptions
from samplechain.runtime.decoding import Rules
from samplechain.validate import cli_non_negative_int


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="samplechain", description="llama.cpp's token sampling, rebuilt in Python")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    g = sub.add_parser("generate", help="generate text from a prompt (llama.cpp's completion flags)")
    io = g.add_argument_group("model and prompt")
    add_model_arguments(io)
    io.add_argument("-p", "--prompt", default=None, help="prompt text")
    io.add_argument("-f", "--file", default=None, help="read the prompt from a file")
    io.add_argument("--display-prompt", dest="display_prompt", action="store_true", default=True,
                    help="print the prompt before the generated text (default)")
    io.add_argument("--no-display-prompt", dest="display_prompt", action="store_false",
                    help="print only the generated text")
    add_declared(io, ModelOptions, defaults={"n_ctx": 4096})  # -c, -b, --device, -t, --kernel, -ctk, -ctv
    add_declared(io, Rules)  # -n, --keep, -r: the stop and limit options (runtime/decoding.py)
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
    io.add_argument("--in-prefix", default="", help="text before each input line (interactive mode)")
    io.add_argument("--in-suffix", default="", help="text after each input line (interactive mode)")
    io.add_argument("--n-probs", type=cli_non_negative_int, default=0, metavar="N",
                    help="print each generated token's top N post-sampling probabilities (to stderr)")
    io.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="gpu_layers", type=int, default=None,
                    help="accepted for llama.cpp compatibility: the whole model runs on --device")
    io.add_argument("--escape", dest="escape", action="store_true", default=True,
                    help="process escapes (\\n, \\t, ...) in the prompt (default)")
    io.add_argument("--no-escape", dest="escape", action="store_false", help="take the prompt as written")
    io.add_argument("--verbose-prompt", action="store_true", help="print the prompt's tokens to stderr")

    s = g.add_argument_group("sampling (llama.cpp's flags and defaults)")
    sp = g.add_argument_group("speculative decoding (llama.cpp's flags; the text is the same with or without)")
    c = g.add_argument_group("constrained output")
    add_sampling_arguments(s, constraints=c)
    add_spec_arguments(sp)
    add_serve_parser(sub)
    add_trace_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[2:] if argv is None else argv[1:])  # the subcommand's own, as given (router mode)
    command = command_parser(parser, args)  # its name prefixes every error: `samplechain generate: error: ...`
    run = {"serve": serve, "trace": trace}.get(args.command, generate)
    previous = catch_ctrl_c() if run is generate else None
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
