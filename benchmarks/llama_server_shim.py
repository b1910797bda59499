"""A stand-in ``llama-server`` binary for llama.cpp's server test suite: ``samplechain serve`` with the same flags.

llama.cpp's ``tools/server/tests/utils.py`` starts ``$LLAMA_SERVER_BIN_PATH`` with llama-server's flags; this shim
replaces the process (``exec``, so the suite's terminate/kill reach the server itself) with
``python -m samplechain serve`` and passes every flag through unchanged except the model sources, which name models
that cannot be downloaded here (there is no network, and nothing here ever tries):

- ``-m/--model``, ``-mu/--model-url``, ``-hf/-hfr/--hf-repo``, ``-hff/--hf-file`` (any of them, once or together)
  become one ``--model STAND_IN``;
- ``-md/--model-draft`` becomes ``--model-draft STAND_IN``.

``STAND_IN`` is ``$SAMPLECHAIN_SUITE_MODEL`` (a GGUF path or a packaged model name), else the packaged default
(SmolLM2-135M-Instruct). A repo the suite's local hub serves (``$SAMPLECHAIN_SUITE_HUB_REPOS``, comma-separated:
``llama_server_suite`` starts that hub) stays ``-hf REPO``, downloaded from it as from the real hub.

A server start without any model source is llama-server's router mode; ``serve`` without one serves its packaged
default model, and needs ``--router`` for that, which the shim adds.

``SAMPLECHAIN_SUITE_DROP_UNKNOWN=1`` is a diagnostic mode only (``llama_server_suite.py --drop-unknown``): flags
that ``serve`` does not know are dropped, with one line each on stderr, so the rest of the suite can run while they
are missing. The results table never comes from that mode.
"""

from __future__ import annotations

import os
import sys

MODEL_FLAGS = ("-m", "--model", "-mu", "--model-url", "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file")
DRAFT_FLAGS = ("-md", "--model-draft")


def stand_in() -> str:
    """The GGUF that stands in for every model the suite names."""
    from samplechain.runtime.generation import model_path

    return model_path(os.environ.get("SAMPLECHAIN_SUITE_MODEL") or None)


def translate(argv: list[str]) -> list[str]:
    """llama-server's command line -> serve's: model sources replaced by the stand-in, everything else as given."""
    out: list[str] = []
    model = draft = False
    hub = [r for r in os.environ.get("SAMPLECHAIN_SUITE_HUB_REPOS", "").split(",") if r]
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        if name in ("-hf", "-hfr", "--hf-repo") and value.split(":")[0] in hub:
            out += ["--hf-repo", value]
            i += 1 if eq else 2
            continue
        if name in MODEL_FLAGS or name in DRAFT_FLAGS:
            i += 1 if eq else 2  # the flag and its value
            if name in MODEL_FLAGS:
                model = True
            else:
                draft = True
            continue
        out.append(arg)
        i += 1
    path = stand_in() if model or draft else ""
    if not model and "--hf-repo" not in out:
        out.append("--router")
    return (["--model", path] if model else []) + (["--model-draft", path] if draft else []) + out


def drop_unknown(args: list[str]) -> list[str]:
    """Diagnostic mode: the flags ``serve`` rejects as unknown, and their values, removed (one stderr line each)."""
    from samplechain.cli import build_parser

    _, extras = build_parser().parse_known_args(["serve", *args])
    if not extras:
        return args
    print(f"llama_server_shim: dropped (serve does not know them): {' '.join(extras)}", file=sys.stderr, flush=True)
    kept, pending = [], list(extras)
    for arg in args:  # remove the extras in order, each once
        if pending and arg == pending[0]:
            pending.pop(0)
            continue
        kept.append(arg)
    return kept


def main() -> None:
    args = translate(sys.argv[1:])
    if os.environ.get("SAMPLECHAIN_SUITE_DROP_UNKNOWN") == "1":
        args = drop_unknown(args)
    os.execv(sys.executable, [sys.executable, "-m", "samplechain", "serve", *args])


if __name__ == "__main__":
    main()
