"""llama.cpp's own server test suite (``tools/server/tests``) run against ``samplechain serve``.

The suite comes from llama.cpp's tree in llama-cpp-python's source distribution (``tests/llama_tree.py`` fetches and
caches it) and is copied into a temporary directory laid out like the tree (``tools/server/tests`` beside
``models/`` and ``tools/mtmd``: tests read templates and images by relative path). ``$LLAMA_SERVER_BIN_PATH`` is
``benchmarks/llama_server_shim.py``: serve with llama-server's flags unchanged, the local model standing in for the
suite's downloads. Two things of the harness are adjusted, neither a test: the session warm-up that starts every
preset once to download its model (``ServerPreset.load_all``) does nothing (there is nothing to download), and the
file that the speculative tests download as a draft model is the stand-in, put where ``download_file`` looks.

The router tests (``test_router``) name Hugging Face models and download one: the suite runs with ``HF_ENDPOINT``
pointed at a local stand-in for the hub (``tests/local_hub.py``, on 127.0.0.1) serving those repos with the stand-in
model as their files, and ``LLAMA_CACHE`` (where the router finds its models, as llama-server) holds the three that
``load_all`` would have downloaded, fetched from it with ``-hf``'s own code before the suite starts.

Each failure is classified: ``MODEL_TEXT`` lists the upstream tests that assert the tiny stories model's exact text,
regex matches or token counts, with the reason; any other failure is "unexplained" and listed with the first line of
its assertion (and serve's own error line when the server did not start).

    python -m benchmarks.llama_server_suite [--files test_basic test_tokenize ...] [-k EXPR] [--markdown FILE]
    python -m benchmarks.llama_server_suite --from-junit full.xml rerun.xml --markdown FILE  # rerun results win
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ("test_basic", "test_tokenize", "test_stream", "test_ignore_eos", "test_kv_keep_only_active", "test_ctx_shift",
         "test_metrics", "test_security", "test_completion", "test_chat_completion", "test_tool_call", "test_template",
         "test_slot_save", "test_speculative", "test_infill", "test_embedding", "test_compat_anthropic",
         "test_compat_oai_responses", "test_router", "test_sleep")
# the suite's router tests name these hub models (ServerPreset.load_all downloads them into the cache first); the
# local hub serves them, the stand-in model as each file, and the cache starts with the first three
HUB_MODELS = {"ggml-org/tinygemma3-GGUF": "tinygemma3-Q8_0.gguf",
              "ggml-org/test-model-stories260K": "stories260K-F32.gguf",
              "ggml-org/test-model-stories260K-infill": "stories260K-infill-F32.gguf",
              "ggml-org/test-model-router-download": "test-model-router-download-F16.gguf"}
CACHED = ("ggml-org/tinygemma3-GGUF", "ggml-org/test-model-stories260K", "ggml-org/test-model-stories260K-infill")
# test_router_remote_preset's repo: a preset.ini at its root makes `-hf` start a router with it
PRESET_REPO = ("ggml-org/test-preset-ci", b"[tinygemma3-preset]\nhf-repo = ggml-org/tinygemma3-GGUF:Q8_0\n\n"
               b"[stories260K-test]\nhf-repo = ggml-org/test-model-stories260K\n")
DRAFT_DOWNLOADS = ("stories15M-q4_0.gguf",)  # files the suite fetches with download_file() into tests/tmp

# Upstream tests whose failure the stand-in model's text alone explains: (test pattern ``file::test[params]``
# (fnmatch), the failure message it must show (regex, searched), why). Each was read in the upstream test: the
# assertion that fails is on the stories models' words, a regex over them, a count of their tokenizer's tokens, or a
# length the stories model reaches where SmolLM2 ends earlier with its end-of-generation token. A failure of the same
# test at another assertion is unexplained.
COUNT = r"^(AssertionError: )?assert \d+ [!=]= \d+"  # a token count (prompt_n, predicted_n, usage, cache_n)
REGEX = r"match_regex\("  # a regex over the stories model's words
MODEL_TEXT: list[tuple[str, str, str]] = [
    ("test_basic::test_load_split_model", REGEX,
     "regex over the greedy text of stories15M (split GGUF), `(little|girl)+`"),
    ("test_speculative::test_multi_requests_parallel[[]*", REGEX,
     "regex `(wise|kind|owl|answer)+` over the stories model's greedy words (every status 200 first)"),
    ("test_tokenize::test_tokenize_with_bos", r"assert \d+ == 1$",
     "expects BOS id 1 first: the stories vocab adds BOS, SmolLM2's GGUF sets add_bos_token false"),
    ("test_ctx_shift::test_ctx_shift_enabled", r"assert \d+ == 226",
     "prompt_n 226 is the stories tokenizer's count of the prompt (SmolLM2's: 117, so nothing shifts)"),
    ("test_ctx_shift::test_ctx_shift_disabled_short_prompt[[]-1-248-True]", r"assert \d+ == 248",
     "expects generation to fill the 256-token slot; SmolLM2 ends with its EOS token first"),
    ("test_ctx_shift::test_ctx_shift_disabled_long_prompt", r"assert 200 != 200",
     "the prompt overflows a 256-token slot with the stories tokenizer only (SmolLM2's count fits)"),
    ("test_ctx_shift::test_ctx_shift_disabled_stream", r"assert 'stop' is None",
     "expects generation to run to the 256-token limit; SmolLM2 ends with its EOS token first (finish_reason stop)"),
    ("test_completion::test_nocache_long_input_prompt", r"assert 200 == 400",
     "the prompt overflows a 256-token slot with the stories tokenizer only (SmolLM2's count fits)"),
    ("test_completion::test_completion[[]*", r"assert \d+ == (18|46)$",
     "prompt_n 18 / 46 are the stories tokenizer's counts (with its BOS), then a regex over its words"),
    ("test_completion::test_completion_stream[[]*", r"assert \d+ == (18|46)$",
     "prompt_n 18 / 46 are the stories tokenizer's counts (with its BOS), then a regex over its words"),
    ("test_completion::test_completion*with_openai_library", REGEX,
     "regex `(going|bed)+` over the stories model's words"),
    ("test_completion::test_completion_response_fields[[]*]", r"== '<s> I believ",
     "expects the prompt echoed with the stories vocab's BOS text `<s> ` (SmolLM2 adds no BOS)"),
    ("test_chat_completion::test_chat_completion[[]*", r"assert \d+ == (69|77|23|104|79)$",
     "usage.prompt_tokens counts the stories tokenizer's tokens of the rendered chat, then a regex over its words"),
    ("test_chat_completion::test_chat_template", r"== '<s> <\|start_",
     "expects the llama3 prompt after the stories vocab's BOS text `<s> ` (SmolLM2 adds no BOS)"),
    ("test_chat_completion::test_chat_completion_cached_tokens", r"assert \d+ == 77$",
     "prompt_tokens 77 / cached_tokens count the stories tokenizer's tokens"),
    ("test_chat_completion::test_chat_completion_stream[[]*", REGEX, "regex over the stories model's words"),
    ("test_chat_completion::test_chat_completion_with_openai_library", REGEX,
     "regex `(Suddenly)+` over the stories model's words"),
    ("test_chat_completion::test_return_progress[[]64-4-False[]]", r"assert \d+ == 4$",
     "4 progress reports: the stories tokenizer's prompt takes 3 batches of 64 (SmolLM2's 70 tokens take 2)"),
    ("test_infill::*", r"assert 501 == (200|400)",
     "SmolLM2's vocabulary has no FIM tokens: /infill answers 501 `Infill is not supported by this model`, as "
     "llama-server does for such a vocabulary, before reading the body (stories260K-infill has them; the prompt "
     "building and the body's checks are tested in tests/server/test_infill.py)"),
    ("test_metrics::test_metrics_embedding_prompt_is_counted", r"assert 400 == 200",
     "SmolLM2's GGUF names no pooling type (a causal LM: none), so /v1/embeddings answers 400 `Pooling type 'none' "
     "is not OAI compatible`, as llama-server does for it; bert-bge-small's GGUF sets CLS pooling"),
    ("test_embedding::test_embedding_mixed_input[[]*", r"assert 400 == 200",
     "SmolLM2's GGUF names no pooling type (none): /v1/embeddings answers 400 `Pooling type 'none' is not OAI "
     "compatible`, as llama-server does for it (with `--pooling last` these inputs are served, but for `\"\"`: "
     "SmolLM2 adds no BOS, so the empty input has no tokens, a 400 in llama-server too)"),
    ("test_embedding::test_embedding_usage_*", r"assert 400 == 200",
     "SmolLM2's GGUF names no pooling type (none): /v1/embeddings answers 400 as llama-server does for it; the "
     "counts 9 / 6 are bert-bge's tokenizer's, with its [CLS] and [SEP]"),
    ("test_embedding::test_embedding_openai_library_base64", r"assert 400 == 200",
     "SmolLM2's GGUF names no pooling type (none): /v1/embeddings answers 400 as llama-server does for it"),
    ("test_embedding::test_embedding_error_prompt_too_long", r"assert 'too large' in 'request \(\d+ tokens\) exceeds "
     r"the available context size",
     "bert-bge is an encoder without a KV cache, so llama-server cannot split its prompt and answers `input (N "
     "tokens) is too large to process` (the batch); SmolLM2 has a cache, pooling `last` reads the prompt in "
     "chunks, and the limit is the context: `request (N tokens) exceeds the available context size`, as "
     "llama-server answers for it"),
    ("test_embedding::test_embedding_pooling_none", r"assert \d+ == 5",
     "5 = 3 tokens of `hello hello hello` + bert-bge's [CLS] and [SEP]; SmolLM2 adds neither"),
    ("test_completion::test_completion_prompt_cache", r"== \d+\)$",
     "n_prompt = (40 + r) * 5 + 2 counts the stories tokenizer's tokens of ` Hello r` repeated"),
    ("test_slot_save::test_slot_save_restore", REGEX,
     "regex `(Whiskers|Flana)+` over the stories model's words (SmolLM2 answers `What is the capital of France?` "
     "with its EOS token at once, temperature 0)"),
    ("test_slot_save::test_slot_erase", REGEX,
     "regex `(Whiskers|Flana)+` over the stories model's words (SmolLM2 answers `What is the capital of France?` "
     "with its EOS token at once, temperature 0)"),
    ("test_slot_save::test_slot_restore_legacy_token_list", r"assert 7 == 84",
     "n_saved 84 is the stories model's 20 prompt tokens + its 64 generated; SmolLM2's slot holds its 7 prompt "
     "tokens (it ends with EOS at once). Past that count the test rewrites the file in llama.cpp's sequence-state "
     "layout (magic, packed token list, ggml KV): our slot files are samplechain's own (`SCKV`), not "
     "interchangeable with llama-server's, so that part would fail as a format we do not provide"),
    ("test_compat_oai_responses::test_responses_with_openai_library", REGEX,
     "regex `(Suddenly)+` over the stories model's words"),
]

# Features samplechain does not provide: (pattern, message regex, the feature). A failure listed here is a test that
# cannot pass without that feature.
NOT_PROVIDED: list[tuple[str, str, str]] = [
    ("test_stream::*", r".", "the router's resumable streams (`/v1/stream`: a stream kept by conversation, "
                              "`X-Conversation-Id`, resumed after a reload or stopped during a load)"),
    ("test_security::test_local_media_file[[]*", r"assert 400 == 200|unrecognized arguments: --media-path",
     "multimodal input (tinygemma3's vision projector, `--media-path` for local image files)"),
    ("test_security::test_cors_proxy_only_forwards_explicit_proxy_headers",
     r"assert 404 == 200|unrecognized arguments: --ui-mcp-proxy",
     "the web UI's MCP proxy (`--ui-mcp-proxy`, `/cors-proxy`)"),
    ("test_slot_save::*image*", r"huggingface\.co|mmproj|media",
     "multimodal input (tinygemma3's vision projector; the test downloads its images)"),
    ("test_slot_save::test_slot_restore_media_file_without_mmproj", r"huggingface\.co|mmproj|media",
     "multimodal input (tinygemma3's vision projector; the test downloads its images)"),
    ("test_security::test_cors_options[[]*", r"Access-Control-Allow-",
     "llama-server's permissive CORS default (every origin echoed, with credentials): samplechain's default is "
     "loopback origins only and `--cors-origins '*'` never carries credentials, by design (docs/server.md, \"Safe by "
     "default\"); `--cors-origins localhost`, which the suite tests too, passes"),
    ("test_security::test_cors_origins_defaults_to_localhost_with_tools_enabled", r"unrecognized arguments: --tools",
     "the server-side agent tools (`--tools`: file and shell tools behind `/tools`); the CORS default this test "
     "checks, loopback origins only, is samplechain's default anyway"),
    ("test_kv_keep_only_active::test_clear_and_restore", r"__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__",
     "the host-memory prompt cache (`--cache-ram`: idle slots saved to RAM and cleared, restored from there; the "
     "test reads its debug log tags): our slots keep their prompts in their own cells"),
    ("test_compat_anthropic::test_anthropic_tool_result_with_image", r"assert 400 == 500",
     "multimodal input: an image block is a 400 `image input is not supported` (no vision model is served), where "
     "llama-server converts it and fails with a 500 for a model without a vision projector"),
    ("test_compat_anthropic::test_anthropic_vision_format_accepted", r"assert 400 == 500",
     "multimodal input: an image block is a 400 `image input is not supported` (no vision model is served), where "
     "llama-server converts it and fails with a 500 for a model without a vision projector"),
    ("test_compat_anthropic::test_anthropic_vision_base64_with_multimodal_model", r"huggingface\.co|mmproj|media",
     "multimodal input (tinygemma3's vision projector; the test downloads its image)"),
    ("test_compat_oai_responses::test_responses_stream_with_llama_telemetry", r"assert None is not None",
     "llama-server's `response.completed` for an answer cut at `max_output_tokens`: samplechain answers as "
     "OpenAI does, status `incomplete` with `incomplete_details.reason: max_output_tokens`, the stream ending "
     "with `response.incomplete` (by design, routes_responses' docstring); the progress and per-token timings "
     "the test checks first are there"),
]

# module -> package, for the suite's imports (requirements.txt) and the per-test timeout
NEEDS = (("openai", "openai"), ("requests", "requests"), ("prometheus_client", "prometheus-client"),
         ("wget", "wget"), ("filelock", "filelock"), ("pytest_timeout", "pytest-timeout"))

PLUGIN = '''"""samplechain's harness: the preset warm-up only downloads models, and nothing downloads here."""
import utils

utils.ServerPreset.load_all = staticmethod(lambda: None)
'''


@dataclass
class Outcome:
    """One file's results; explained failures keep their (test id, reason), unexplained ones (test id, first line)."""

    passed: int = 0
    skipped: int = 0
    model_text: list[tuple[str, str]] = field(default_factory=list)
    not_provided: list[tuple[str, str]] = field(default_factory=list)
    unexplained: list[tuple[str, str]] = field(default_factory=list)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare(workdir: Path) -> Path:
    """The suite copied under ``workdir`` as in llama.cpp's tree; returns its ``tools/server/tests``."""
    sys.path.insert(0, str(ROOT / "tests"))
    from benchmarks.llama_server_shim import stand_in
    from llama_tree import llama_cpp_tree

    tree = llama_cpp_tree()
    tests = workdir / "tools" / "server" / "tests"
    shutil.copytree(tree / "tools" / "server" / "tests", tests)
    shutil.copytree(tree / "tools" / "mtmd", workdir / "tools" / "mtmd")
    (workdir / "models").symlink_to(tree / "models")
    (tests / "tmp").mkdir(exist_ok=True)
    for name in DRAFT_DOWNLOADS:
        (tests / "tmp" / name).symlink_to(stand_in())
    (tests / "_samplechain_harness.py").write_text(PLUGIN)
    shim = workdir / "llama-server"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{ROOT / "benchmarks" / "llama_server_shim.py"}" "$@"\n')
    shim.chmod(0o755)
    return tests


def local_hub(workdir: Path) -> tuple[object, dict[str, str]]:
    """The hub stand-in, started, and the suite's environment for it: ``HF_ENDPOINT`` and ``LLAMA_CACHE`` (filled
    with the models ``load_all`` would have downloaded)."""
    from benchmarks.llama_server_shim import stand_in
    from local_hub import LocalHub
    from samplechain.runtime.hub import download_model

    model = Path(stand_in())
    hub = LocalHub({**{repo: {name: model} for repo, name in HUB_MODELS.items()},
                    PRESET_REPO[0]: {"preset.ini": PRESET_REPO[1]}}).start()
    env = {"HF_ENDPOINT": hub.url, "LLAMA_CACHE": str(workdir / "hub-cache"), "HF_HUB_DISABLE_PROGRESS_BARS": "1",
           "SAMPLECHAIN_SUITE_HUB_REPOS": ",".join([*HUB_MODELS, PRESET_REPO[0]])}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        for repo in CACHED:
            download_model(repo, offline=False)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return hub, env


def run_suite(tests: Path, files: list[str], junit: Path, timeout: int, slow: bool, drop_unknown: bool,
              select: str | None = None, extra_env: dict[str, str] | None = None) -> int:
    """pytest over ``files`` in the copied suite (``select``: a ``-k`` expression); the report goes to ``junit``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "DEBUG", "DEBUG_EXTERNAL")}
    env.update(extra_env or {})
    src = str(ROOT / "src")
    env.update(LLAMA_SERVER_BIN_PATH=str(tests.parents[2] / "llama-server"), PORT=str(_free_port()),
               PYTHONPATH=os.pathsep.join([str(tests), src, str(ROOT)]))
    env["SAMPLECHAIN_SUITE_DROP_UNKNOWN"] = "1" if drop_unknown else "0"
    cmd = [sys.executable, "-m", "pytest", *[f"unit/{f}.py" for f in files], "-p", "_samplechain_harness",
           "-p", "no:cacheprovider", f"--junitxml={junit}", "-o", "junit_logging=all", f"--timeout={timeout}",
           "-q", "-rN"]
    if not slow:
        cmd += ["-m", "not slow"]
    if select:
        cmd += ["-k", select]
    return subprocess.run(cmd, cwd=tests, env=env).returncode


def reason(table: list[tuple[str, str, str]], test_id: str, message: str) -> str | None:
    """The reason ``table`` gives for this failure of ``test_id`` (pattern and message both match), or None."""
    for pattern, shows, why in table:
        if fnmatch.fnmatchcase(test_id, pattern) and re.search(shows, message, re.M):
            return why
    return None


def _first_line(case: ET.Element, bad: ET.Element) -> str:
    """The failure's first line; when the server did not start, serve's own error line with it."""
    message = (bad.get("message") or bad.text or "").strip()
    line = message.splitlines()[0] if message else bad.tag
    if "Server process died" in message or "Server did not start" in message:
        out = "\n".join((e.text or "") for e in case.iter() if e.tag in ("system-out", "system-err"))
        errors = [m.group(0) for m in re.finditer(r"^.*\b(error|refused|unrecognized|invalid)\b.*$", out, re.M | re.I)]
        if errors:
            line += f" -- {errors[-1].strip()}"
    return line[:300]


def parse(*junits: Path) -> dict[str, Outcome]:
    """Per file: passed / failed for the model's text / for a feature not provided / unexplained / skipped. A test
    in several reports counts once, as the last report has it (a rerun of some tests after a fix)."""
    cases: dict[tuple[str, str], ET.Element] = {}
    for case in (c for junit in junits for c in ET.parse(junit).getroot().iter("testcase")):
        cases[(case.get("classname", "").split(".")[-1], case.get("name", ""))] = case
    outcomes: dict[str, Outcome] = {}
    for (module, name), case in cases.items():
        test_id = f"{module}::{name}"
        o = outcomes.setdefault(module, Outcome())
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            # the assertion, and for a server that did not start serve's own error line
            message = (bad.get("message") or bad.text or "").strip() + "\n" + _first_line(case, bad)
            if why := reason(MODEL_TEXT, test_id, message):
                o.model_text.append((test_id, why))
            elif why := reason(NOT_PROVIDED, test_id, message):
                o.not_provided.append((test_id, why))
            else:
                o.unexplained.append((test_id, _first_line(case, bad)))
        elif case.find("skipped") is not None:
            o.skipped += 1
        else:
            o.passed += 1
    order = {name: i for i, name in enumerate(FILES)}
    return dict(sorted(outcomes.items(), key=lambda item: (order.get(item[0], len(order)), item[0])))


def table(outcomes: dict[str, Outcome], markdown: bool) -> str:
    """The per-file table (plain text, or markdown for the README)."""
    head = ("file", "passed", "failed (model text)", "failed (not provided)", "failed (unexplained)", "skipped")
    rows = [(f, str(o.passed), str(len(o.model_text)), str(len(o.not_provided)), str(len(o.unexplained)),
             str(o.skipped)) for f, o in outcomes.items()]
    rows.append(("total", *(str(sum(int(r[i]) for r in rows)) for i in range(1, len(head)))))
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [head, *rows])


def explained(outcomes: dict[str, Outcome], markdown: bool) -> str:
    """The failures that cannot pass here, each reason once with its tests."""
    groups: dict[tuple[str, str], list[str]] = {}
    for o in outcomes.values():
        for kind, items in (("model text", o.model_text), ("not provided", o.not_provided)):
            for test_id, why in items:
                groups.setdefault((kind, why), []).append(test_id)
    bullet = "- " if markdown else "  "
    return "\n".join(f"{bullet}{kind}: {why}: {', '.join(f'`{t}`' if markdown else t for t in tests)}"
                     for (kind, why), tests in groups.items())


def missing_packages() -> list[str]:
    """The suite's own imports (its requirements.txt) and pytest-timeout, where this environment lacks them."""
    import importlib.util

    return [pkg for module, pkg in NEEDS if importlib.util.find_spec(module) is None]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", nargs="+", default=list(FILES), help="suite files (unit/NAME.py) to run")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per test (pytest-timeout)")
    ap.add_argument("--slow", action="store_true", help="include the tests marked slow (they need real models)")
    ap.add_argument("-k", dest="select", default=None, help="only the tests this pytest -k expression selects")
    ap.add_argument("--junit", type=Path, default=None, help="keep the junit report here")
    ap.add_argument("--from-junit", type=Path, nargs="+", default=None,
                    help="classify earlier reports, run nothing (a test in several: the last report's result)")
    ap.add_argument("--markdown", type=Path, default=None, help="write the table as markdown to this file")
    ap.add_argument("--drop-unknown", action="store_true",
                    help="diagnostic: the shim drops flags serve does not know (never for the results table)")
    args = ap.parse_args(argv)
    files = [f.removesuffix(".py").removeprefix("unit/") for f in args.files]
    if args.from_junit:
        outcomes = parse(*args.from_junit)
    elif missing := missing_packages():
        print(f"the suite needs: pip install {' '.join(missing)}", file=sys.stderr)
        return 2
    else:
        with tempfile.TemporaryDirectory(prefix="llama-server-suite-") as tmp:
            tests = prepare(Path(tmp))
            junit = args.junit or Path(tmp) / "junit.xml"
            hub, env = local_hub(Path(tmp))
            try:
                run_suite(tests, files, junit.resolve(), args.timeout, args.slow, args.drop_unknown, args.select,
                          env)
            finally:
                hub.close()
            outcomes = parse(junit)
    print(table(outcomes, markdown=False))
    if any(o.model_text or o.not_provided for o in outcomes.values()):
        print("\nexplained failures:\n" + explained(outcomes, markdown=False))
    unexplained = [u for o in outcomes.values() for u in o.unexplained]
    if unexplained:
        print(f"\nunexplained failures ({len(unexplained)}):")
        for test_id, line in unexplained:
            print(f"  {test_id}: {line}")
    if args.markdown:
        args.markdown.write_text(table(outcomes, markdown=True) + "\n\n" + explained(outcomes, markdown=True) + "\n")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
