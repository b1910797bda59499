"""Concurrent streaming chat against samplechain's server and llama-cpp-python's server, in the same run (issue 14.7).

Each server runs as a subprocess (its own process group, killed on exit) on a free port, with the same GGUF, the same
thread count and the same context per stream. Both are started up front (idle, they cost no CPU) and driven one at a
time, level by level and repeat by repeat in alternating order, so that the shared machine's drifting load falls on
both alike. Per level of concurrency, ``/v1/chat/completions`` with ``stream: true`` is sent by that many client
threads at once, and the table reports total generated tokens/s (every stream's tokens / wall time of the level),
time to first token p50/p95, errors (HTTP or transport failures, error events), truncated streams, tokens per stream,
and the ratio samplechain / llama-cpp-python of total tokens/s.

Fairness rule: both servers are driven identically. Every request carries the same fields on both sides: the same
user prompt (each asks for a long answer, and no earlier request had it), the same sampling fields (llama.cpp's
default chain spelled out), the same ``max_tokens``, the same seed per stream. Nothing that puts per-token Python work
into either server's token loop is sent: no ``min_tokens`` (llama-cpp-python implements it as a Python logits
processor in its token loop), no ``ignore_eos``, no ``logit_bias``, no grammar, no logprobs; EOS is allowed on both,
so a stream may end with ``finish_reason`` "stop" before ``max_tokens`` (that is not a failure). Tokens are counted
by one rule for both: each stream's completion text is re-tokenized with one tokenizer (samplechain's, of the same
GGUF, ``tokenize(text, add_special=False, parse_special=False)``), and total tokens/s is the sum over streams / wall
time. A stream is truncated when it ended without a finish_reason or ``[DONE]``, or with finish_reason "length" but
fewer than ``max_tokens`` tokens by the server's own count (``usage.completion_tokens`` where the server sends it,
samplechain with ``stream_options.include_usage``; otherwise content chunks, one per token in llama-cpp-python).

llama-cpp-python's server runs one request at a time (a lock around its single ``Llama``); it is started with
``--interrupt_requests False``, since by default a waiting request cuts the running stream short. It is launched
through this module (``--serve-anchor``) so that the model loads with ``use_extra_bufts=False``
(ggml's AMX path segfaults on some machines of this kind); ``Llama(use_extra_bufts=False)``
would be swallowed by its ``**kwargs``, so the default model parameters are patched instead.

Also: single-stream decode rate through the server (tokens after the first / time after the first token, at
concurrency 1, by the server's own count) against the in-process runtime (``load_model().generate``, the same chat
prompt and sampling, EOS allowed,
decode + sampling time per token), interleaved run by run with the servers; the best runs are compared (the least
disturbed by the shared machine), the medians shown beside them.
Run: ``make bench``, or ``python -m benchmarks.bench_server [--levels 1,4,8,16] [--skip-anchor]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

TOPICS = ["the ocean", "volcanoes", "honeybees", "the moon", "bread", "trains", "glaciers", "owls", "chess",
          "rainforests", "bicycles", "lighthouses", "coffee", "deserts", "whales", "libraries"]
# long answers: most streams run to max_tokens with EOS allowed
PROMPTS = [f"Write a long, detailed essay about {topic}, at least ten paragraphs: its history, how it works, the "
           f"people it matters to, and what may come next." for topic in TOPICS]
# llama.cpp's default chain, spelled out so both servers sample alike
SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0,
            "frequency_penalty": 0.0, "presence_penalty": 0.0}
TARGET_STREAMS, TARGET_RATIO, MOONSHOT_RATIO, TARGET_TTFT_P95, TARGET_SINGLE = 8, 3.0, 6.0, 2.0, 0.10


def prompt(i: int, n: int, repeat: int) -> str:
    """Stream ``i`` of ``n`` in run ``repeat``: a prompt no earlier request had (a server may keep finished prompts
    in its cache; the shared chat header stays reusable, as in real traffic)."""
    return f"{PROMPTS[(i + repeat) % len(PROMPTS)]} (Request {n}.{repeat}.{i}.)"


# --- servers ------------------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server subprocess in its own process group; ``stop`` kills the whole group."""

    def __init__(self, name: str, argv: list[str], port: int, ready_path: str) -> None:
        self.name, self.argv, self.port, self.ready_path = name, argv, port, ready_path
        self.log = tempfile.NamedTemporaryFile(prefix=f"bench_server_{name}_", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 300.0) -> float:
        """Launch and wait until ``ready_path`` answers 200; returns the seconds that took."""
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        while time.perf_counter() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", self.ready_path)
                status = conn.getresponse().status
                conn.close()
                if status == 200:
                    return time.perf_counter() - t0
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 20) -> str:
        self.log.flush()
        with open(self.log.name, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def close(self) -> None:
        self.stop()
        self.log.close()
        os.unlink(self.log.name)


def samplechain_server(model: str, threads: int, slots: int, ctx_per_stream: int) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "samplechain", "serve", "-m", model, "--port", str(port), "-np", str(slots),
            "-c", str(slots * ctx_per_stream), "-t", str(threads)]
    return Server("samplechain", argv, port, "/health")


def anchor_server(model: str, threads: int, ctx_per_stream: int) -> Server:
    """llama-cpp-python's server: one ``Llama`` with one stream's context (it serves one request at a time)."""
    port = free_port()
    argv = [sys.executable, "-m", "benchmarks.bench_server", "--serve-anchor", "--",
            "--model", model, "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(ctx_per_stream),
            "--n_batch", "512", "--n_threads", str(threads), "--n_threads_batch", str(threads),
            "--interrupt_requests", "False", "--verbose", "False"]
    # it loads the model before it listens, so the first 200 on /v1/models means ready (it has no /health)
    return Server("llama-cpp-python", argv, port, "/v1/models")


def serve_anchor(argv: list[str]) -> None:
    """``python -m llama_cpp.server`` with the model loaded under ``use_extra_bufts=False``."""
    import uvicorn
    from llama_cpp.server import app as server_app
    from llama_cpp.server.cli import add_args_from_model, parse_model_from_args
    from llama_cpp.server.settings import ModelSettings, ServerSettings, Settings

    from benchmarks import _llama

    _llama.without_extra_bufts()
    parser = argparse.ArgumentParser(prog="bench_server --serve-anchor")
    add_args_from_model(parser, Settings)
    args = parser.parse_args(argv)
    server_settings = parse_model_from_args(ServerSettings, args)
    app = server_app.create_app(server_settings=server_settings,
                                model_settings=[parse_model_from_args(ModelSettings, args)])
    loaded = server_app._llama_proxy._current_model
    print(f"anchor: model loaded, use_extra_bufts={loaded.model_params.use_extra_bufts}", file=sys.stderr,
          flush=True)
    uvicorn.run(app, host=server_settings.host, port=server_settings.port, log_level="warning")


# --- the client ---------------------------------------------------------------------------------------------------

@dataclass
class Stream:
    prompt: str
    t_sent: float = 0.0
    t_first: float | None = None  # first content token
    t_last: float | None = None
    t_end: float = 0.0
    chunks: int = 0  # content chunks
    usage_tokens: int | None = None
    finish: str | None = None
    done: bool = False  # saw data: [DONE]
    error: str | None = None
    text: list[str] = field(default_factory=list)
    counted: int = 0  # the completion text re-tokenized with the one tokenizer used for both servers

    @property
    def tokens(self) -> int:
        """The server's own count: ``usage.completion_tokens`` where it sends it, else content chunks."""
        return self.usage_tokens if self.usage_tokens is not None else self.chunks

    def truncated(self, max_tokens: int) -> bool:
        if self.error is not None:
            return False  # counted as an error
        return self.finish is None or not self.done or (self.finish == "length" and self.tokens < max_tokens)


def stream_chat(port: int, s: Stream, max_tokens: int, seed: int, timeout: float) -> None:
    # the same body for both servers: no min_tokens, ignore_eos, logit_bias (see the module's fairness rule)
    body = {"messages": [{"role": "user", "content": s.prompt}], "stream": True, "max_tokens": max_tokens,
            "stream_options": {"include_usage": True}, "seed": seed, **SAMPLING}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        s.t_sent = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            s.error = f"HTTP {resp.status}: {resp.read()[:200]!r}"
            return
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators, ": ping" comments
            data = line[5:].strip()
            if data == b"[DONE]":
                s.done = True
                break
            ev = json.loads(data)
            if "error" in ev:
                s.error = f"error event: {json.dumps(ev['error'])[:200]}"
                return
            if ev.get("usage"):
                s.usage_tokens = ev["usage"].get("completion_tokens")
            for choice in ev.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    now = time.perf_counter()
                    s.t_first = s.t_first or now
                    s.t_last = now
                    s.chunks += 1
                    s.text.append(content)
                if choice.get("finish_reason"):
                    s.finish = choice["finish_reason"]
    except Exception as e:
        s.error = f"{type(e).__name__}: {e}"
    finally:
        s.t_end = time.perf_counter()
        conn.close()


@dataclass
class Level:
    streams: int
    rates: list[float] = field(default_factory=list)  # total tok/s (the one tokenizer's count), one per repeat
    ttft: list[float] = field(default_factory=list)
    decode: list[float] = field(default_factory=list)  # per-stream decode tok/s (tokens after the first)
    errors: int = 0
    truncated: int = 0
    stopped_early: int = 0  # finish_reason "stop" before max_tokens (EOS): not an error, fewer tokens counted
    samples: list[str] = field(default_factory=list)
    counted: list[int] = field(default_factory=list)  # per stream, the one tokenizer's count
    own: list[int] = field(default_factory=list)  # per stream, the server's own count

    @property
    def per_stream(self) -> float:
        return statistics.mean(self.counted) if self.counted else float("nan")

    @property
    def rate(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0

    def ttft_pct(self, q: float) -> float:
        if not self.ttft:
            return float("nan")
        xs = sorted(self.ttft)
        return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def run_level(port: int, level: Level, max_tokens: int, timeout: float, repeat: int,
              count_tokens: Callable[[str], int]) -> None:
    """``level.streams`` streams started together, accumulated into ``level``; throughput counts each stream's
    completion text with ``count_tokens`` (the same function for every server)."""
    n = level.streams
    streams = [Stream(prompt(i, n, repeat)) for i in range(n)]
    barrier = threading.Barrier(n + 1)

    def client(s: Stream, seed: int) -> None:
        barrier.wait()
        stream_chat(port, s, max_tokens, seed, timeout)

    threads = [threading.Thread(target=client, args=(s, 42 + 1000 * repeat + i), daemon=True)
               for i, s in enumerate(streams)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join(timeout + 30)
    wall = max(s.t_end for s in streams) - t0
    for s in streams:
        if s.error is None:
            s.counted = count_tokens("".join(s.text))  # after the wall time: not part of it
    level.rates.append(sum(s.counted for s in streams if s.error is None) / wall)
    for s in streams:
        if s.error is None:
            level.counted.append(s.counted)
            level.own.append(s.tokens)
        if s.error is not None:
            level.errors += 1
            if len(level.samples) < 3:
                level.samples.append(s.error)
            continue
        if s.truncated(max_tokens):
            level.truncated += 1
            if len(level.samples) < 3:
                level.samples.append(f"truncated: finish={s.finish} done={s.done} tokens={s.tokens} "
                                     f"(chunks {s.chunks}, re-tokenized {s.counted})")
        elif s.finish == "stop" and s.tokens < max_tokens:
            level.stopped_early += 1
        if s.t_first is not None:
            level.ttft.append(s.t_first - s.t_sent)
            if s.tokens > 1 and s.t_last > s.t_first:
                level.decode.append((s.tokens - 1) / (s.t_last - s.t_first))


def start_server(server: Server, timeout: float) -> dict:
    """Start, warm up with one request; the result dict that the levels fill."""
    ready_s = server.start()
    warm = Stream(PROMPTS[0])
    stream_chat(server.port, warm, 16, 1, timeout)
    if warm.error is not None or warm.finish is None:
        raise RuntimeError(f"{server.name}: warm-up request failed: {warm.error or 'no finish_reason'}\n"
                           f"{server.log_tail()}")
    loaded = [line.strip() for line in server.log_tail(50).splitlines() if "model loaded" in line]
    print(f"# {server.name}: ready in {ready_s:.1f} s; {loaded[-1] if loaded else ''}", flush=True)
    return {"levels": {}}


def bench_servers(servers: list[Server], levels: list[int], max_tokens: int, repeats: int, single_repeats: int,
                  timeout: float, in_process: InProcess) -> list[dict]:
    """Every server started (an idle one costs no CPU), then level by level, repeat by repeat, one server at a time,
    alternating which goes first: the machine's drifting load falls on both alike. At one stream (``single_repeats``
    runs) the in-process runtime takes its turn too."""
    results = [start_server(s, timeout) for s in servers]
    for n in levels:
        for res in results:
            res["levels"][n] = Level(n)
        for r in range(single_repeats if n == 1 else repeats):
            order = list(range(len(servers) + (n == 1)))[:: 1 if r % 2 == 0 else -1]
            for k in order:
                if k == len(servers):
                    in_process.measure(prompt(0, 1, r), max_tokens)
                else:
                    run_level(servers[k].port, results[k]["levels"][n], max_tokens, timeout, r, in_process.count)
        print(f"# {n} streams: " + ", ".join(f"{s.name} {res['levels'][n].rate:.1f} tok/s"
                                             for s, res in zip(servers, results, strict=True)), flush=True)
    return results


# --- in-process reference -----------------------------------------------------------------------------------------

class InProcess:
    """``load_model().generate`` in this process with the servers' sampling: decode tok/s counted as the server's
    single-stream rate is (tokens after the first over their decode + sampling time)."""

    def __init__(self, model_name: str, threads: int) -> None:
        from samplechain import SamplingParams
        from samplechain.runtime import load_model

        self.model = load_model(model_name, n_threads=threads)
        self.params = SamplingParams(seed=42, temperature=SAMPLING["temperature"],
                                     top_k=SAMPLING["top_k"], top_p=SAMPLING["top_p"], min_p=SAMPLING["min_p"],
                                     repeat_penalty=1.0)
        self.rates: list[float] = []
        for _ in self.model.generate(PROMPTS[0], self.params, n_predict=16, chat=True):
            pass  # warm-up

    @property
    def kernel(self) -> str:
        return self.model.transformer.kernel

    @property
    def rate(self) -> float:
        return statistics.median(self.rates) if self.rates else float("nan")

    def count(self, text: str) -> int:
        """The one token count applied to both servers' completion texts."""
        return len(self.model.tokenize(text, add_special=False, parse_special=False)) if text else 0

    def measure(self, text: str, max_tokens: int) -> None:
        for _ in self.model.generate(text, self.params, n_predict=max_tokens, chat=True):
            pass
        t = self.model.timings
        if t.n_eval and t.n_sample:  # EOS allowed: a run that stopped at once has no decode step
            self.rates.append(1e3 / (t.eval_ms / t.n_eval + t.sample_ms / t.n_sample))


# --- report -------------------------------------------------------------------------------------------------------

def _cell(lv: Level | None) -> str:
    if lv is None:
        return f"{'-':>8} {'-':>14} {'-':>9} {'-':>7}"
    ttft = f"{lv.ttft_pct(0.5):.2f}/{lv.ttft_pct(0.95):.2f}"
    return f"{lv.rate:8.1f} {ttft:>14} {f'{lv.errors}/{lv.truncated}':>9} {lv.per_stream:7.1f}"


def report(ours: dict, anchor: dict | None, levels: list[int], args, in_process: InProcess) -> None:
    print(f"\nSmolLM2-135M-Instruct Q4_1, {args.threads} threads each, max_tokens {args.max_tokens}, EOS allowed on "
          f"both, the same requests to both (no min_tokens / ignore_eos / logit_bias), {args.repeats} runs per level "
          f"({args.single_repeats} at 1 stream), servers interleaved (tok/s: every stream's completion text "
          f"re-tokenized with one tokenizer / wall time, median of the runs; TTFT over all streams of all runs; "
          f"tok/str: mean tokens per stream)")
    print(f"{'':>7}  {'samplechain':^41} | {'llama-cpp-python':^41} |")
    head = f"{'tok/s':>8} {'TTFT p50/p95 s':>14} {'err/trunc':>9} {'tok/str':>7}"
    print(f"{'streams':>7}  {head} | {head} | {'ratio':>6}")
    for n in levels:
        lv = ours["levels"][n]
        al = anchor["levels"][n] if anchor else None
        ratio = f"{lv.rate / al.rate:6.2f}" if al and al.rate > 0 else f"{'-':>6}"
        print(f"{n:>7}  {_cell(lv)} | {_cell(al)} | {ratio}")
    notes = []
    for who, res in (("samplechain", ours), ("llama-cpp-python", anchor)):
        for n, lv in (res or {"levels": {}})["levels"].items():
            if lv.stopped_early:
                notes.append(f"{who} {n} streams: {lv.stopped_early} of {len(lv.counted)} stream(s) ended with "
                             f"'stop' (EOS) before max_tokens")
            if lv.own and sum(lv.own) != sum(lv.counted):
                notes.append(f"{who} {n} streams: {sum(lv.counted)} tokens re-tokenized (counted), "
                             f"{sum(lv.own)} by the server's own count")
            for sample in lv.samples:
                notes.append(f"{who} {n} streams: {sample}")
    for line in notes:
        print(f"  note: {line}")

    single = ours["levels"].get(1)
    if single and single.decode and in_process.rates:
        # the best of the interleaved runs is the one least disturbed by the shared machine; the medians are shown too
        served, alone = max(single.decode), max(in_process.rates)
        delta = served / alone - 1
        print(f"\nsingle-stream decode, best of {len(single.decode)} interleaved runs: server {served:.1f} tok/s, "
              f"in-process runtime {alone:.1f} tok/s (kernel {in_process.kernel}): {100 * delta:+.1f} % "
              f"(medians {statistics.median(single.decode):.1f} and {in_process.rate:.1f})")
        print(f"  runs: server {', '.join(f'{x:.0f}' for x in single.decode)}; in-process "
              f"{', '.join(f'{x:.0f}' for x in in_process.rates)}")

    print("\ntargets (issue 14.7):")
    lv = ours["levels"].get(TARGET_STREAMS)
    if lv is not None:
        if anchor:
            ratio = lv.rate / anchor["levels"][TARGET_STREAMS].rate
            verdict = "met" if ratio >= TARGET_RATIO else "NOT met"
            moon = " (moonshot met)" if ratio >= MOONSHOT_RATIO else ""
            print(f"  {TARGET_STREAMS} streams >= {TARGET_RATIO:.0f}x the anchor's total tok/s (moonshot "
                  f"{MOONSHOT_RATIO:.0f}x): {ratio:.2f}x, {verdict}{moon}")
        p95 = lv.ttft_pct(0.95)
        print(f"  {TARGET_STREAMS} streams TTFT p95 < {TARGET_TTFT_P95:.0f} s: {p95:.2f} s, "
              f"{'met' if p95 < TARGET_TTFT_P95 else 'NOT met'}")
    bad = sum(x.errors + x.truncated for x in ours["levels"].values())
    print(f"  zero truncated or failed streams (samplechain, all levels): {bad}, {'met' if bad == 0 else 'NOT met'}")
    if single and single.decode and in_process.rates:
        print(f"  single-stream decode within {100 * TARGET_SINGLE:.0f} % of the in-process runtime (best runs): "
              f"{100 * delta:+.1f} %, {'met' if abs(delta) <= TARGET_SINGLE else 'NOT met'}")


def main() -> None:
    if "--serve-anchor" in sys.argv[1:]:
        rest = sys.argv[sys.argv.index("--serve-anchor") + 1:]
        serve_anchor(rest[1:] if rest[:1] == ["--"] else rest)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,4,8,16", help="concurrent streams per level, comma-separated")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens generated per stream")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of each server (and in-process)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per level and server")
    parser.add_argument("--single-repeats", type=int, default=7,
                        help="runs at one stream (the single-stream decode comparison), per server and in-process")
    parser.add_argument("--ctx-per-stream", type=int, default=512, help="context cells per stream")
    parser.add_argument("--model", default="smollm2", help="GGUF file or packaged model name")
    parser.add_argument("--timeout", type=float, default=300.0, help="per-request read timeout, seconds")
    parser.add_argument("--skip-anchor", action="store_true", help="samplechain's server only")
    parser.add_argument("--serve-anchor", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    levels = sorted({int(x) for x in args.levels.split(",") if x.strip()})
    if not levels or levels[0] < 1:
        parser.error(f"--levels must be positive integers, got {args.levels!r}")
    if args.max_tokens + 96 > args.ctx_per_stream:
        parser.error(f"--ctx-per-stream {args.ctx_per_stream} leaves no room for the prompt and --max-tokens "
                     f"{args.max_tokens}; raise it to at least {args.max_tokens + 96}")

    # a SIGTERM to the benchmark unwinds through the finally blocks that kill the servers
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from samplechain.runtime.generation import model_path

    model = model_path(args.model)
    load_before = os.getloadavg()[0]
    in_process = InProcess(args.model, args.threads)
    servers = [samplechain_server(model, args.threads, max(levels), args.ctx_per_stream)]
    if not args.skip_anchor:
        servers.append(anchor_server(model, args.threads, args.ctx_per_stream))
    try:
        results = bench_servers(servers, levels, args.max_tokens, args.repeats, args.single_repeats, args.timeout,
                                in_process)
    finally:
        for s in servers:
            s.close()
    report(results[0], results[1] if len(results) > 1 else None, levels, args, in_process)
    print(f"\n1-minute load average of this machine ({os.cpu_count()} CPUs, shared): {load_before:.2f} before the run, "
          f"{os.getloadavg()[0]:.2f} after (it includes this benchmark's own load)")


if __name__ == "__main__":
    main()
