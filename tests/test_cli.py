import io
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from samplechain.cli import build_parser, main
from samplechain.cli import run as cli_run
from samplechain.cli.common import params_from_args
from samplechain.param_specs import declarations
from samplechain.params import SamplingParams

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def smol_cli(smol, monkeypatch):
    """``main()`` runs of the default model use the session's loaded one instead of loading it again."""
    load = cli_run.load_model
    monkeypatch.setattr(cli_run, "load_model", lambda name, args, kernel=None: smol if name is None
                        else load(name, args, kernel))
    yield smol
    smol.on_token = None


def _run(*args):
    return subprocess.run([sys.executable, "-m", "samplechain", *args], capture_output=True, text=True, timeout=300)


def test_chat_answer_with_greedy_sampling():
    r = _run("generate", "-p", "What is the capital of France?", "--chat", "--temp", "0", "-n", "32")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    for line in ("load time", "prompt eval time", "eval time", "sampling time"):
        assert line in r.stderr


@pytest.mark.parametrize("args", [
    ["generate", "--bogus"], ["generate", "--mirostat", "3"], ["generate", "-n", "-5"], ["generate", "--top-k", "x"],
    ["generate", "--repeat-last-n", "-1"], ["generate", "-l", "12x"], ["generate", "--samplers", "nope"],
    ["generate", "-p", "a", "-f", "b"], ["generate", "-s", "99999999999"], ["frobnicate"], [],
])
def test_bad_flags_are_usage_errors(args, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_flags_map_to_llama_cpp_defaults():
    p = params_from_args(build_parser().parse_args(["generate"]))
    assert (p.top_k, p.top_p, p.min_p, p.temperature, p.repeat_last_n, p.seed) == (40, 0.95, 0.05, 0.8, 64, 0xFFFFFFFF)
    args = build_parser().parse_args([
        "generate", "-s", "-1", "--temp", "-3", "--sampler-seq", "kt", "-l", "15043+1", "-l", "2-inf",
        "--dry-sequence-breaker", "\\n", "--dry-sequence-breaker", "x", "--repeat-last-n", "128"])
    p = params_from_args(args)
    assert p.seed == 0xFFFFFFFF and p.temperature == 0.0 and p.samplers == ("top_k", "temperature")
    assert p.logit_bias == ((15043, 1.0), (2, float("-inf")))
    assert p.dry_sequence_breakers == ("\n", "x") and p.n_prev == 128
    none = params_from_args(build_parser().parse_args(["generate", "--dry-sequence-breaker", "none"]))
    assert none.dry_sequence_breakers == ()


def _run_stdin(stdin, *args):
    return subprocess.run([sys.executable, "-m", "samplechain", *args], input=stdin, capture_output=True, text=True,
                          timeout=300)


def test_conversation_mode_reads_turns_from_stdin():
    r = _run_stdin("What is the capital of France?\n\nAnd of Germany?\n", "generate", "-cnv", "--temp", "0",
                   "-n", "40")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["The capital of France is Paris.", "The capital of Germany is Berlin."]
    assert "prompt eval time" in r.stderr and "Traceback" not in r.stderr


def test_conversation_mode_with_a_first_prompt_and_system_prompt():
    r = _run_stdin("", "generate", "-cnv", "-sys", "You are terse.", "-p", "What is the capital of France?",
                   "--temp", "0", "-n", "40")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout


def test_interactive_mode_with_reverse_prompt_and_prefix(monkeypatch, capsys, smol_cli):
    import io

    from samplechain.runtime import chat

    sent = []
    real_send = chat.ChatSession.send

    def send(self, text):
        sent.append((self.template, text))
        return real_send(self, text)

    monkeypatch.setattr(chat.ChatSession, "send", send)
    monkeypatch.setattr(sys, "stdin", io.StringIO("and then\n"))
    assert main(["generate", "-i", "-p", "Once upon a time", "-r", ".", "--in-prefix", " ", "--in-suffix", ",",
                 "-n", "30", "-s", "1", "--no-perf"]) == 0
    assert sent == [(False, "Once upon a time"), (False, " and then,")]
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("Once upon a time")  # the prompt first, as llama.cpp's
    assert all(line.endswith(".") or len(line) > 60 for line in out)


def test_n_probs_prints_each_tokens_top_probabilities(capsys, smol_cli):
    assert main(["generate", "-p", "The capital of France is", "-n", "5", "-s", "3", "--n-probs", "3",
                 "--no-perf"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "<-" in line]
    assert len(err) == 5
    for line in err:
        assert 1 <= line.count(", ") + 1 <= 3
        probs = [float(x.rsplit(" ", 1)[1]) for x in line.split("<-")[1].split(", ")]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0001


@pytest.mark.parametrize("args, message", [
    (["generate", "--temp", "nan"], "--temp/--temperature: must be a number, got nan"),
    (["generate", "--top-p", "abc"], "--top-p: expected a number"),
    (["generate", "--n-probs", "-1"], "--n-probs: must be >= 0"),
    (["generate", "-p", "Hi", "-b", "0"], "-b/--batch-size must be positive, got 0"),
    (["generate", "-p", "Hi", "-b", "-1"], "-b/--batch-size must be positive, got -1"),
    (["generate", "-p", "Hi", "--prompt-cache", "/nonexistent/folder/cache.bin"],
     "--prompt-cache: the folder /nonexistent/folder does not exist"),
    (["serve", "-b", "0"], "-b/--batch-size must be positive, got 0"),
    (["serve", "--timeout", "0"], "--timeout: must be >= 1, got 0"),
    (["serve", "--shutdown-grace", "-1"], "--shutdown-grace: must be >= 0, got -1"),
    (["serve", "--slot-save-path", "/nonexistent/slots"], "--slot-save-path: not a directory: /nonexistent/slots"),
    (["serve", "--no-jinja", "--chat-template", "{{ x }}"], "the supplied chat template is not supported: '{{ x }}'"),
    (["serve", "--chat-template", "{% if %}"], "the supplied chat template is not supported: chat template does not"),
    (["serve", "--chat-template-file", "/nonexistent.jinja"],
     "--chat-template-file: cannot read chat template file /nonexistent.jinja"),
    (["serve", "-ctk", "q3_k"], "-ctk/--cache-type-k: unsupported cache type 'q3_k'"),
    (["serve", "--lora", "a.gguf"], "LoRA adapters (--lora): not provided by samplechain serve"),
    (["serve", "--reranking"], "reranking (--reranking): not provided by samplechain serve"),
    (["serve", "--models-dir", "/nonexistent"], "--models-dir: '/nonexistent' does not exist or is not a directory"),
    (["serve", "--models-dir", "/tmp", "-m", "x.gguf"], "start a router over many models: without -m or -hf"),
    (["serve", "--models-max", "2"], "--models-max / --no-models-autoload are router mode's"),
    (["serve", "--router", "--ray"], "router mode runs on one machine: without --ray"),
    (["serve", "-fa", "maybe"], "-fa/--flash-attn: unknown value 'maybe' (on, off or auto)"),
    (["serve", "--reasoning", "maybe"], "--reasoning: unknown value 'maybe' (on, off or auto)"),
    (["serve", "--sleep-idle-seconds", "0"], "--sleep-idle-seconds: cannot be 0 or less than -1, got 0"),
    (["serve", "--host", " , "], "--host requires at least one address"),
])
def test_bad_values_are_one_line_usage_errors(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and message in err and "usage:" in err


def test_a_context_larger_than_memory_is_one_line(capsys, smol_cli):
    assert main(["generate", "-p", "Hi", "-n", "2", "-c", "1000000000000"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("samplechain generate: error: a KV cache of 1000000000000 cells ")
    assert "GiB of cpu memory: use a smaller context" in err


def test_gpu_layers_flag_is_accepted_with_a_note(capsys, smol_cli):
    assert main(["generate", "-p", "Hi", "-n", "2", "-ngl", "99", "--no-perf"]) == 0
    assert "note: -ngl 99 is ignored" in capsys.readouterr().err


def test_ctrl_c_prints_the_timings_and_exits_130():
    """Started with SIGINT ignored, as a background job of a script or a test runner's worker may be: the command
    still catches Ctrl-C (llama.cpp's completion tool installs its handler unconditionally). The signal is sent once
    the first answer is out (the session then waits for the next turn), and stdin stays open until the process has
    exited, so end of input cannot end the session first."""
    proc = subprocess.Popen([sys.executable, "-m", "samplechain", "generate", "-cnv", "-n", "8", "--temp", "0"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        proc.stdin.write("Hello\n")
        proc.stdin.flush()
        assert proc.stdout.readline()  # the first answer
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130
        err = proc.stderr.read()
    finally:
        proc.kill()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()
    assert "prompt eval time" in err and "Traceback" not in err


def test_reasoning_budget_flags():
    args = build_parser().parse_args(["generate", "--reasoning-budget", "5", "--reasoning-budget-message", "Done."])
    p = params_from_args(args)
    assert (p.reasoning_budget_tokens, p.reasoning_budget_message) == (5, "Done.")
    assert (p.reasoning_budget_start_tag, p.reasoning_budget_end_tags) == ("<think>", ("</think>",))
    assert params_from_args(build_parser().parse_args(["generate"])).reasoning_budget_tokens == -1


def test_generation_with_a_reasoning_budget_runs(capsys, smol_cli):
    assert main(["generate", "-p", "Think step by step: 2 + 2 =", "-n", "6", "-s", "2", "--reasoning-budget", "0",
                 "--no-perf"]) == 0
    assert capsys.readouterr().out.strip()


COPY = ("Text: The ocean covers seventy percent of the planet. Its currents move heat from the equator to the poles, "
        "and its depths store carbon for centuries.\n\nThe same text, copied exactly:\n\nText: The ocean")


@pytest.mark.parametrize("spec", [["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3"],
                                  ["--spec-type", "ngram-map-k,ngram-mod", "--spec-ngram-map-k-size-n", "2"],
                                  ["--spec-default"], ["--spec-type", "ngram-cache"]])
def test_speculative_flags_give_the_same_text(spec, capsys, smol_cli):
    base = ["generate", "-p", COPY, "-n", "32", "--temp", "0"]
    assert main([*base, "--no-perf"]) == 0
    want = capsys.readouterr().out
    assert main([*base, *spec]) == 0
    captured = capsys.readouterr()
    assert captured.out == want
    assert "speculative = " in captured.err


def test_draft_model_flags(capsys, smol_cli):
    base = ["generate", "-p", COPY, "-n", "16", "--temp", "0", "--no-perf"]
    assert main(base) == 0
    want = capsys.readouterr().out
    assert main([*base, "--spec-type", "draft-simple", "-md", "smollm2", "--draft-max", "4"]) == 0
    captured = capsys.readouterr()
    assert captured.out == want and "draft-simple" in captured.err


@pytest.mark.parametrize("args, message", [
    (["--spec-type", "ngram-magic"], "ngram-magic"),
    (["--spec-type", "draft-simple"], "needs a draft model"),
    (["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "0"], "n_match"),
    (["--draft-min", "9", "--draft-max", "4", "--spec-type", "ngram-simple"], "draft-min 9 exceeds draft-max 4"),
])
def test_bad_speculative_flags(args, message, capsys, smol_cli):
    assert main(["generate", "-p", "Hi", "-n", "2", *args]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("samplechain generate: error: ") and message in err


def test_bad_draft_numbers_are_usage_errors(capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--draft-max", "-1"])
    assert e.value.code == 2 and "--draft-max" in capsys.readouterr().err


def test_serve_takes_llama_servers_flags(monkeypatch, capsys, tmp_path):
    """Each flag of llama-server's test suite: its meaning in the server's config, or one note where it has none."""
    import samplechain.server.app as app

    got = []
    monkeypatch.setattr(app, "serve", lambda config, log_level: got.append((config, log_level)) or 0)
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[0]['content'] }}")
    assert main(["serve", "--jinja", "--chat-template-file", str(template), "-v", "--kv-unified", "--alias",
                 "b, a", "--tags", "chat,small", "--no-ui", "--host", "127.0.0.1,::1", "--slot-save-path",
                 str(tmp_path), "--reasoning-format", "none", "--reasoning", "off", "-fa", "on", "--offline",
                 "--sleep-idle-seconds", "5", "--cache-ram", "100", "--no-cache-idle-slots", "-ctk", "q8_0", "-ctv",
                 "q8_0", "--swa-full", "--grp-attn-n", "2", "--grp-attn-w", "512", "--backend_sampling",
                 "--no-slots", "--tools", "all", "--ui-mcp-proxy", "--media-path", str(tmp_path), "--no-mmproj"]) == 0
    config, log_level = got[0]
    assert (config.chat_template, config.use_jinja, config.kv_unified, config.ui) == (
        "{{ messages[0]['content'] }}", True, True, False)
    assert (config.alias, config.tags, config.host, config.slot_save_path) == (
        ("b", "a"), ("chat", "small"), "127.0.0.1,::1", str(tmp_path))
    assert (config.reasoning_format, config.enable_thinking, config.defaults.verbose, log_level) == (
        "none", False, True, "debug")
    assert config.defaults.params.backend_sampling is True and config.slots is False
    assert config.sleep_idle_seconds == 5
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]
    assert [n.split(":")[1].strip() for n in notes] == [
        "--tools", "--ui-mcp-proxy / --mcp-servers-*", "--media-path / --mmproj / --no-mmproj", "-fa",
        "--cache-ram / --cache-idle-slots", "--swa-full",
        "--grp-attn-n / --grp-attn-w"]
    assert (config.cache_type_k, config.cache_type_v) == ("q8_0", "q8_0")  # kept as f16, said when the model loads
    got.clear()
    assert main(["serve", "--no-jinja", "--chat-template", "llama3"]) == 0
    config = got[0][0]
    assert (config.chat_template, config.use_jinja, config.enable_thinking, config.defaults.verbose) == (
        "llama3", False, None, False)
    assert config.responses_store == 256
    got.clear()
    assert main(["serve", "--responses-store", "0"]) == 0
    assert got[0][0].responses_store == 0
    with pytest.raises(SystemExit):
        main(["serve", "--responses-store", "-5"])
    assert "argument --responses-store: must be >= 0, got -5" in capsys.readouterr().err

def test_the_prompt_is_echoed_and_a_random_seed_is_printed_so_the_run_repeats(capsys, smol_cli):
    assert main(["generate", "-p", "Once upon a time", "-n", "6", "-s", "-1", "--no-perf"]) == 0
    first = capsys.readouterr()
    assert first.out.startswith("Once upon a time") and len(first.out) > len("Once upon a time\n")
    seed = int(re.search(r"^sampler seed: (\d+)$", first.err, re.M).group(1))
    assert "sampler params: \n\trepeat_last_n = 64, repeat_penalty = 1.000, frequency_penalty = 0.000" in first.err
    assert "\ttop_k = 40, top_p = 0.950, min_p = 0.050, xtc_probability = 0.000, xtc_threshold = 0.100, " in first.err
    assert "sampler chain: logits -> top-k -> top-p -> min-p -> temp-ext -> dist\n" in first.err
    assert "generate: n_ctx = 4096, n_batch = 512, n_predict = 6, n_keep = 0\n" in first.err
    assert main(["generate", "-p", "Once upon a time", "-n", "6", "-s", str(seed), "--no-perf",
                 "--no-display-prompt"]) == 0
    again = capsys.readouterr()
    assert "Once upon a time" + again.out == first.out  # the same tokens from the printed seed
    assert f"sampler seed: {seed}\n" in again.err


def test_the_echo_shows_special_tokens_as_nothing(smol):
    tokens = [smol.vocab.bos, *smol.tokenize("Hello", add_special=False)]
    assert smol.vocab.bos in smol.vocab.special
    assert cli_run._pieces(smol, tokens) == "Hello"  # llama.cpp's token_to_piece without special: BOS is empty


def test_a_chat_prompt_is_echoed_as_a_turn(capsys, smol_cli):
    assert main(["generate", "-p", "What is the capital of France?", "--chat", "--temp", "0", "-n", "12",
                 "--no-perf"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("> What is the capital of France?\nThe capital of France is Paris")


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_conversation_on_a_terminal_hints_how_to_leave_and_exit_leaves(monkeypatch, capsys, smol_cli):
    from samplechain.runtime import chat

    sent = []
    monkeypatch.setattr(chat.ChatSession, "send", lambda self, text: sent.append(text) or iter(()))
    monkeypatch.setattr(sys, "stdin", _Terminal("/exit\nnever sent\n"))
    assert main(["generate", "-cnv", "--no-perf"]) == 0
    captured = capsys.readouterr()
    assert "conversation mode: type a line and press Return; /exit or Ctrl-D to leave" in captured.err
    assert captured.out == "> " and sent == []
    monkeypatch.setattr(sys, "stdin", io.StringIO("/exit\n"))  # not a terminal: no hint, no prompt
    assert main(["generate", "-cnv", "--no-perf"]) == 0
    captured = capsys.readouterr()
    assert "mode:" not in captured.err and captured.out == "" and sent == []


def test_help_gives_each_sampling_flags_meaning_and_declared_default():
    generate = build_parser()._subparsers._group_actions[0].choices["generate"]
    actions = generate._option_string_actions
    for d in declarations(SamplingParams):
        for f in d.cli:
            text = actions[f.names[0]].help
            assert text and not text.startswith("("), f.names  # a meaning first
            switch = dict(f.options).get("action") in ("store_true", "store_false")
            assert switch or "(default: " in text, f.names
    assert actions["--top-p"].help.endswith(f"(default: {SamplingParams().top_p:.2f})")
    assert actions["--seed"].help.endswith("(default: -1)") and actions["--perf"].help.endswith("(default)")
    assert actions["--samplers"].help.endswith(f"(default: {';'.join(SamplingParams().samplers)})")
    text = " ".join(generate.format_help().split())
    assert "--top-k N keep the K most likely tokens (0 = off) (default: 40)" in text
    assert "-c N, --ctx-size N context size (0 = model's) (default: 4096)" in text  # the command's own flags too
    assert "--no-display-prompt print only the generated text" in text


@pytest.mark.parametrize("args", [["generate", "--bogus"], ["generate", "--top-k", "x"], ["serve", "--bogus"],
                                  ["serve", "-b", "0"], ["trace", "-p", "x", "--steps", "0"], ["trace"]])
def test_every_error_of_a_command_has_its_prefix(args, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"samplechain {args[0]}: error: ") and err.count("\n") == 1


def test_a_missing_model_is_an_error_of_the_command(capsys):
    assert main(["generate", "-p", "Hi", "-m", "missing.gguf"]) == 1
    assert capsys.readouterr().err == ("samplechain generate: error: no model file 'missing.gguf' (and not a "
                                       "packaged model: smollm2, gemma3-270m)\n")
