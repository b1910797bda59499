"""Speculative decoding through the CLI: ``samplechain generate`` with n-gram drafting against plain decoding, and
llama.cpp's prompt lookup (llama-cpp-python's ``LlamaPromptLookupDecoding``) on the same GGUF, 2 threads, same run.

Four tasks: copy a paragraph, fix code and print it, summarise with quotes, an open story; greedy decoding of
``--n`` tokens. Each side runs as the command a user types (``samplechain generate ... --temp 0``, then the same
with ``--spec-type ...``); each run's decode time is read from the timing lines it prints on stderr (llama.cpp-style
``eval time`` + ``sampling time``: the forwards, the drafter's work and the verification, from the first generated
token on). The two run back to back, ``--repeat`` times, and the pair with the median speed-up is shown: on a
shared machine the load changes from one minute to the next, and a pair run under one load gives that load's
speed-up, where the fastest run of each side may come from different moments. Per task: the speed-up, the
acceptance, the mean draft length, the tokens drafted out of those generated, the verify cost the run measured (a
batch of n tokens against one, in ms), and whether the text is identical with and without drafting (ours: always,
by batch-invariant logits; llama.cpp: often not). llama.cpp's side is paired the same way.
Run: ``python -m benchmarks.bench_speculative`` (llama.cpp's side needs llama-cpp-python: ``make bench``).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from dataclasses import dataclass

PARA = ("The ocean covers seventy percent of the planet. Its currents move heat from the equator to the poles, and "
        "its depths store carbon for centuries. Without it, the weather of every continent would be different, "
        "and the air itself would hold far less oxygen. Every second breath we take comes from the sea.")
CODE = ("def mean(values):\n    total = 0\n    for v in values:\n        total += v\n"
        "    return total / len(vaules)\n\n\n"
        "def variance(values):\n    m = mean(values)\n    return sum((v - m) ** 2 for v in values) / len(values)\n\n\n"
        "def stdev(values):\n    return variance(values) ** 0.5\n")
TASKS = {
    "copy": f"Text: {PARA}\n\nThe same text, copied exactly:\n\nText: The ocean",
    "code": f"# buggy version\n{CODE}\n\n# fixed version (only `vaules` changed to `values`)\ndef mean(values):\n",
    "quotes": f"Summarize this text, quoting its key sentences word for word:\n\n{PARA}\n\nSummary:",
    "story": "Once upon a time, in a lighthouse at the edge of the world,",
}
# ngram-simple with 8-token keys (llama.cpp's default, 12, leaves 11 undrafted tokens before each copy starts), then
# ngram-map-k with 3-token keys for what it misses; `--spec "--spec-type ngram-simple --draft-max 16"` for the defaults
SPEC = ("--spec-type ngram-simple,ngram-map-k --draft-max 16 --spec-ngram-simple-size-n 8 "
        "--spec-ngram-map-k-size-n 3")

_NUMBER = r"([0-9.]+)"


@dataclass
class Run:
    """One ``samplechain generate``: its text and what its stderr says."""

    text: str
    decode_ms: float  # eval time + sampling time
    n_eval: int  # forwards
    n_sample: int  # tokens generated
    drafts: int = 0
    drafted: int = 0
    accepted: int = 0
    verify: str = ""  # "16 tokens 58.3 ms vs 1 token 19.1 ms (3.05x), ..." (the cost the run measured)


def parse(stdout: str, stderr: str) -> Run:
    """The timing and drafting lines of ``generate``'s stderr (``Timings.report``, ``Speculation.report``)."""
    def find(pattern: str) -> re.Match[str]:
        m = re.search(pattern, stderr)
        if m is None:
            raise RuntimeError(f"no {pattern!r} in generate's stderr:\n{stderr}")
        return m

    ev = find(rf"\n\s*eval time = +{_NUMBER} ms / +(\d+) runs")
    sa = find(rf"sampling time = +{_NUMBER} ms / +(\d+) runs")
    run = Run(stdout, float(ev[1]) + float(sa[1]), int(ev[2]), int(sa[2]))
    for m in re.finditer(r"speculative = [\w-]+: (\d+) drafts, (\d+) tokens drafted, (\d+) accepted", stderr):
        run.drafts += int(m[1])
        run.drafted += int(m[2])
        run.accepted += int(m[3])
    v = re.search(r"verify cost = (.*)", stderr)
    run.verify = v[1].split(",")[0] if v else "-"
    return run


def generate(prompt: str, n: int, extra: list[str]) -> Run:
    argv = [sys.executable, "-m", "samplechain", "generate", "-p", prompt, "-n", str(n), "--temp", "0", "-t", "2",
            "--no-display-prompt", *extra]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed ({done.returncode}):\n{done.stderr}")
    return parse(done.stdout, done.stderr)


def ours(prompt: str, n: int, spec: list[str], repeat: int) -> tuple[Run, Run, bool]:
    """``repeat`` pairs of a plain and a drafted run, back to back (in turns, plain first then drafted first, so a
    drift in the machine's load favours neither); returns the pair whose speed-up is the median, and whether every
    text was the same."""
    pairs = []
    for i in range(repeat):
        if i % 2 == 0:
            plain = generate(prompt, n, [])
            fast = generate(prompt, n, spec)
        else:
            fast = generate(prompt, n, spec)
            plain = generate(prompt, n, [])
        pairs.append((plain, fast))
    same = len({r.text for pair in pairs for r in pair}) == 1
    pairs.sort(key=lambda pair: pair[0].decode_ms / pair[1].decode_ms)
    plain, fast = pairs[(len(pairs) - 1) // 2]
    return plain, fast, same


class LlamaCpp:
    """llama-cpp-python on the same GGUF, 2 threads: plain decoding and its prompt lookup (``k`` tokens a draft)."""

    def __init__(self, path: str, k: int) -> None:
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        from benchmarks import _llama

        _llama.without_extra_bufts()
        self.plain, self.lookup = (
            llama_cpp.Llama(path, n_threads=2, n_threads_batch=2, n_ctx=2048, verbose=False, logits_all=True,
                            draft_model=draft) for draft in (None, LlamaPromptLookupDecoding(num_pred_tokens=k)))

    @staticmethod
    def run(llm: object, prompt: str, n: int) -> tuple[list[int], float]:
        """Greedy tokens and their rate (tokens per second from the first generated token, as ours is timed)."""
        toks: list[int] = []
        t0 = None
        for tok in llm.generate(llm.tokenize(prompt.encode()), temp=0.0, top_k=1, reset=True):  # type: ignore[attr-defined]
            if t0 is None:
                t0 = time.perf_counter()
            toks.append(tok)
            if len(toks) > n or tok == llm.token_eos():  # type: ignore[attr-defined]
                break
        return toks, (len(toks) - 1) / (time.perf_counter() - t0)  # type: ignore[operator]

    def speedup(self, prompt: str, n: int, repeat: int) -> tuple[float, bool]:
        """The median speed-up of ``repeat`` pairs (in turns, as ours), and whether every text was the same."""
        ratios, texts = [], set()
        for i in range(repeat):
            order = (self.plain, self.lookup) if i % 2 == 0 else (self.lookup, self.plain)
            got = {id(llm): self.run(llm, prompt, n) for llm in order}
            (plain, r_plain), (fast, r_fast) = got[id(self.plain)], got[id(self.lookup)]
            ratios.append(r_fast / r_plain)
            texts.update((tuple(plain), tuple(fast)))
        return sorted(ratios)[(repeat - 1) // 2], len(texts) == 1


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=192, help="tokens to generate per task")
    parser.add_argument("--spec", default=SPEC, help=f"generate's drafting flags (default: {SPEC})")
    parser.add_argument("--repeat", type=int, default=5, help="pairs of runs per task; the median pair is shown")
    parser.add_argument("--k", type=int, default=10, help="llama.cpp prompt lookup: tokens per draft")
    parser.add_argument("--no-llama", action="store_true", help="skip llama.cpp")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated tasks")
    args = parser.parse_args()

    print(f"samplechain generate, SmolLM2-135M Q4_1, greedy, {args.n} tokens, 2 threads, median of {args.repeat} "
          f"pairs; drafting: {args.spec}; llama.cpp: prompt lookup, {args.k} tokens")
    print(f"{'task':<7} {'plain ms':>8} {'spec ms':>8} {'speedup':>8} {'accept':>7} {'mean len':>8} "
          f"{'drafted/gen':>11} {'verify cost (batch of n vs 1)':<44} {'same':>5} | {'llama.cpp':>9} {'same':>5}")
    llama = None
    if not args.no_llama:
        from samplechain.runtime import model_path

        llama = LlamaCpp(model_path(), args.k)
    for name in args.tasks.split(","):
        prompt = TASKS[name]
        plain, spec, same = ours(prompt, args.n, args.spec.split(), args.repeat)
        line = (f"{name:<7} {plain.decode_ms:8.1f} {spec.decode_ms:8.1f} {plain.decode_ms / spec.decode_ms:7.2f}x "
                f"{100 * spec.accepted / max(spec.drafted, 1):6.1f}% {spec.drafted / max(spec.drafts, 1):8.2f} "
                f"{f'{spec.drafted}/{spec.n_sample}':>11} {spec.verify:<44} {same!s:>5} |")
        if llama is not None:
            speedup, lsame = llama.speedup(prompt, args.n, args.repeat)
            line += f" {speedup:8.2f}x {lsame!s:>5}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
