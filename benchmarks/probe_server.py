"""Fault probe of ``samplechain serve`` (issue 20's targets), run against a real server process on loopback.

1. Load: 64 concurrent requests on ``-np 4``, a mix of the three generation routes, streaming and not, ``n`` 1
   and 2: every one must answer 200 with the text the same request gives alone (same seed), none 500 or empty.
2. Bad input: oversized enums, schemas, grammars and breakers, deep nesting, lone surrogates, malformed JSON and
   fields: every one a 4xx within 2 s; the server's RSS back within 10 % of its idle level afterwards.
3. SIGTERM with 8 running streams (and 4 queued): exit status 0 within the grace period + 2 s, every client
   a final event (the running ones their finish reason and an error chunk, the queued ones a 503).

``python -m benchmarks.probe_server`` prints one table per probe. Nothing here is timed against an anchor: these
are pass/fail targets, bounded in count and time, loopback only.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

CHAT = [{"role": "user", "content": "Name three colours and say why you like them."}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port: int, path: str, body: Any = None, raw: bytes | None = None,
            timeout: float = 300) -> tuple[int, bytes, float]:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = raw if raw is not None else json.dumps(body).encode()
    conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    out = r.read()
    conn.close()
    return r.status, out, time.perf_counter() - t0


def events(body: bytes) -> list[Any]:
    out = []
    for line in body.decode().splitlines():
        if line.startswith("data: "):
            out.append(line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]))
    return out


def texts(path: str, stream: bool, status: int, body: bytes) -> list[str] | None:
    """The choices' texts, or None for an answer that is not a complete 200."""
    if status != 200 or not body:
        return None
    if not stream:
        r = json.loads(body)
        if path == "/completion":
            return [r["content"]]
        key = (lambda c: c["text"]) if path == "/v1/completions" else (lambda c: c["message"]["content"])
        return [key(c) for c in sorted(r["choices"], key=lambda c: c["index"])] or None
    evs = [e for e in events(body) if e != "[DONE]"]
    if not evs or any("error" in e for e in evs):
        return None
    out: dict[int, str] = {}
    for e in evs:
        if path == "/completion":
            out[0] = out.get(0, "") + e["content"]
        for c in e.get("choices", []):
            piece = c.get("text") if path == "/v1/completions" else (c.get("delta") or {}).get("content")
            out[c["index"]] = out.get(c["index"], "") + (piece or "")
    return [out[i] for i in sorted(out)]


class Server:
    def __init__(self, *flags: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "samplechain", "serve", "--port", str(self.port),
                                      *flags], stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 300
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the server did not start: {self.proc.stderr.read()[-2000:]}")
            time.sleep(0.2)

    def rss_mib(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.stderr.read()


def load_probe(server: Server, n: int = 64) -> None:
    long_prompt = "Once upon a time, in a quiet town by the sea, there lived " * 12
    todo = []
    for k in range(n):
        stream, route = k % 2 == 1, ("/completion", "/v1/completions", "/v1/chat/completions")[k % 3]
        body: dict[str, Any] = {"seed": k, "stream": stream, "max_tokens" if route != "/completion" else "n_predict":
                                24 + k % 5}
        if route == "/v1/chat/completions":
            body["messages"] = CHAT
        else:
            body["prompt"] = long_prompt if k % 7 == 0 else f"Item {k}: a list of"
        if route != "/completion" and k % 8 == 5:
            body["n"] = 2
        todo.append((route, body))
    alone = [texts(route, body["stream"], *request(server.port, route, body)[:2]) for route, body in todo]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        replies = list(pool.map(lambda rb: request(server.port, *rb), todo))
    wall = time.perf_counter() - t0
    bad = sum(1 for (route, body), (status, out, _) in zip(todo, replies, strict=True)
              if texts(route, body["stream"], status, out) is None)
    differ = sum(1 for (route, body), (status, out, _), ref in zip(todo, replies, alone, strict=True)
                 if texts(route, body["stream"], status, out) != ref)
    statuses = sorted({r[0] for r in replies})
    print("| probe | requests | statuses | 500 or empty | text differs from alone | wall s |")
    print("|---|---|---|---|---|---|")
    print(f"| {n} concurrent, -np 4 | {n} | {statuses} | {bad} | {differ} | {wall:.1f} |")


def bad_inputs() -> list[tuple[str, str, bytes]]:
    def js(obj: Any) -> bytes:
        return json.dumps(obj).encode()

    deep = 10_000
    schema_800 = '{"type": "object", "properties": {"a": ' * 800 + '{"type": "string"}' + "}}" * 800
    out = []
    for route in ("/completion", "/v1/completions", "/v1/chat/completions"):
        base: dict[str, Any] = {"messages": CHAT} if route.endswith("chat/completions") else {"prompt": "Hi"}
        head = json.dumps(base)[1:-1]
        cases = {
            "enum 100,000": js({**base, "json_schema": {"enum": list(range(100_000))}}),
            "schema 3,000 properties": js({**base, "json_schema": {"type": "object", "properties": {
                f"p{i}": {"type": "integer"} for i in range(3000)}}}),
            "grammar 20,000 alternatives": js({**base, "grammar": "root ::= " + " | ".join(
                f'"w{i}"' for i in range(20_000))}),
            "dry breakers 10,000 x 1,000": js({**base, "dry_multiplier": 0.8,
                                               "dry_sequence_breakers": ["x" * 1000] * 10_000}),
            "json_schema 800 deep": f'{{{head}, "json_schema": {schema_800}}}'.encode(),
            "body 10,000 deep": b"[" * deep + b"]" * deep,
            "malformed JSON": b"{not json",
            "invalid UTF-8": b'{"prompt": "\xff\xfe"}',
            "NaN": b'{"prompt": NaN}',
            "lone surrogate": f'{{{head}, "stop": "\\ud800x"}}'.encode(),
            "logit_bias key -1": js({**base, "logit_bias": {"-1": 1}}),
            "logit_bias value lots": js({**base, "logit_bias": {"15": "lots"}}),
            "logit_bias 7": js({**base, "logit_bias": 7}),
            "logit_bias out of vocabulary": js({**base, "logit_bias": [[10**7, 1]]}),
            'stop ""': js({**base, "stop": ""}),
            "2,000 prompts": js({"prompt": ["p"] * 2000}),
            "prompt of 10 MB": js({**base, "prompt": "a" * 10_000_000}) if "messages" not in base else
            js({"messages": [{"role": "user", "content": "a" * 10_000_000}]}),
        }
        for name, raw in cases.items():
            out.append((route, name, raw))
    out.append(("/tokenize", "lone surrogate", b'{"content": "\\ud800x"}'))
    return out


def bad_input_probe(server: Server) -> None:
    for route, base in (("/completion", {"prompt": "Hi"}), ("/v1/completions", {"prompt": "Hi"}),
                        ("/v1/chat/completions", {"messages": CHAT})):  # warm: every route has run once
        request(server.port, route, {**base, "max_tokens": 4, "json_schema": {"enum": ["a", "b"]}})
    idle = server.rss_mib()
    rows, worst, over = [], 0.0, 0
    for route, name, raw in bad_inputs():
        status, body, seconds = request(server.port, route, raw=raw, timeout=60)
        worst = max(worst, seconds)
        ok = 400 <= status < 500 and seconds < 2.0
        over += not ok
        if not ok:
            rows.append(f"| {route} | {name} | {status} | {seconds:.2f} | {body[:120]!r} |")
    time.sleep(1.0)
    after = server.rss_mib()
    n = len(bad_inputs())
    print("| probe | cases | 4xx within 2 s | slowest s | RSS idle MiB | RSS after MiB | change |")
    print("|---|---|---|---|---|---|---|")
    change = 100 * (after / idle - 1)
    print(f"| bad input | {n} | {n - over} | {worst:.2f} | {idle:.0f} | {after:.0f} | {change:+.1f} % |")
    for row in rows:
        print(row)


def sigterm_probe(grace: float = 10.0) -> None:
    server = Server("-np", "8", "-c", "16384", "--shutdown-grace", str(grace))
    out: dict[int, tuple[int, bytes, float]] = {}
    body = {"messages": CHAT, "max_tokens": 100_000, "ignore_eos": True, "stream": True, "seed": 1}

    def go(i: int) -> None:
        out[i] = request(server.port, "/v1/chat/completions", {**body, "seed": i})

    threads = [threading.Thread(target=go, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    time.sleep(3.0)
    t0 = time.perf_counter()
    server.proc.send_signal(signal.SIGTERM)
    rc = server.proc.wait(grace + 30)
    exit_s = time.perf_counter() - t0
    for t in threads:
        t.join(10)
    finals = 0
    for status, raw, _ in out.values():
        if status == 503:
            finals += json.loads(raw)["error"]["message"] == "the server is shutting down"
            continue
        evs = events(raw)
        finals += (len(evs) >= 2 and "error" in evs[-1] and
                   evs[-2].get("choices", [{}])[0].get("finish_reason") is not None)
    stderr = server.stop()
    print("| probe | streams | exit status | exit after s (grace) | clients with a final event | tracebacks |")
    print("|---|---|---|---|---|---|")
    print(f"| SIGTERM | 8 running + 4 queued | {rc} | {exit_s:.1f} ({grace:g}) | {finals}/{len(out)} "
          f"| {stderr.count('Traceback')} |")


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    server = Server("-np", "4", "-c", "8192")
    try:
        load_probe(server)
        print()
        bad_input_probe(server)
    finally:
        server.stop()
    print()
    sigterm_probe()


if __name__ == "__main__":
    main()
