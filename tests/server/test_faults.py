"""The server under faults, as a client meets them: requests that wait (more requests than slots, slow steps, long
prompts), clients that leave, bad and oversized input, slow connections, and shutdown. Every request completes
with the text it gives alone, or is refused with a 4xx, or is cancelled; none is answered 500 or empty."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import h11
import pytest
from tests.server.conftest import call, live_server

from samplechain.server import limits, prompts
from samplechain.server.app import BackgroundServer, ServerConfig

CHAT = [{"role": "user", "content": "Name three colours."}]
SLOW_STEP = 0.15  # seconds added to every forward: with 2 slots, a queued request waits well past 0.5 s


@pytest.fixture(scope="module")
def small(smol):
    """2 slots of 256 cells: most tests here send more requests than that."""
    with live_server(smol, n_slots=2, n_ctx=512, head_timeout=1.0, timeout=2) as s:
        yield s


@contextlib.contextmanager
def slow_steps(server, seconds: float = SLOW_STEP):
    engine = server.state.engine
    engine.step_hook = lambda: time.sleep(seconds)
    try:
        yield
    finally:
        engine.step_hook = None


def idle(server, timeout: float = 10.0) -> bool:
    """Whether every slot is idle within ``timeout`` seconds (and nothing is queued)."""
    engine = server.state.engine
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not any(s.busy for s in engine.slots) and engine.n_deferred == 0:
            return True
        time.sleep(0.05)
    return False


def _wait_until(condition, timeout: float = 30.0) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds rather than hang."""
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, "the server never reached the awaited state"
        time.sleep(0.01)


def text_of(path: str, body: dict, reply) -> list[str]:
    """The generated text of each choice, from a non-streaming or streaming reply."""
    assert reply.status == 200, reply.body
    if not body.get("stream"):
        r = reply.json()
        if path == "/completion":
            return [x["content"] for x in (r if isinstance(r, list) else [r])]
        if path == "/v1/completions":
            return [c["text"] for c in sorted(r["choices"], key=lambda c: c["index"])]
        if path == "/v1/messages":
            return ["".join(b["text"] for b in r["content"] if b["type"] == "text")]
        if path == "/v1/responses":
            return ["".join(p["text"] for item in r["output"] if item["type"] == "message" for p in item["content"])]
        return [c["message"]["content"] for c in sorted(r["choices"], key=lambda c: c["index"])]
    events = [e for e in reply.events() if e != "[DONE]"]
    assert events and all("error" not in e and e.get("type") != "error" for e in events), events
    if path == "/v1/messages":
        return ["".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")]
    if path == "/v1/responses":
        return ["".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")]
    out: dict[int, str] = {}
    for e in events:
        if path == "/completion":
            out[e.get("index", 0)] = out.get(e.get("index", 0), "") + e["content"]
        for c in e.get("choices", []):
            piece = c.get("text") if path == "/v1/completions" else (c.get("delta") or {}).get("content")
            out[c["index"]] = out.get(c["index"], "") + (piece or "")
    return [out[i] for i in sorted(out)]


def requests() -> list[tuple[str, dict]]:
    """A mix of the five generation routes (native, OpenAI completions and chat, Anthropic Messages, OpenAI
    Responses), streaming and not, n > 1, with a longer prompt among them."""
    long_prompt = "Once upon a time, in a quiet town by the sea, " * 8
    out = []
    for k in range(16):
        stream = k % 2 == 1
        if k >= 12:
            out.append(("/v1/messages", {"messages": CHAT, "max_tokens": 6, "seed": k, "stream": stream})
                       if k < 14 else ("/v1/responses", {"input": CHAT, "max_output_tokens": 6, "seed": k,
                                                         "stream": stream}))
        elif k % 3 == 0:
            out.append(("/completion", {"prompt": long_prompt if k == 6 else f"Story {k}:", "n_predict": 6,
                                        "seed": k, "stream": stream}))
        elif k % 3 == 1:
            out.append(("/v1/completions", {"prompt": f"List {k}:", "max_tokens": 6, "seed": k, "stream": stream,
                                            "n": 2 if k == 4 else 1}))
        else:
            out.append(("/v1/chat/completions", {"messages": CHAT, "max_tokens": 6, "seed": k, "stream": stream,
                                                 "n": 2 if k == 5 else 1}))
    return out


def test_requests_that_wait_get_the_text_they_get_alone(small):
    """16 requests on 2 slots, each step slowed: most wait seconds for a slot, none is lost (a 0.5 s wait once
    closed the event generator of a non-streaming request: 200 with [] or 500 IndexError)."""
    todo = requests()
    alone = [text_of(path, body, call(small, "POST", path, body)) for path, body in todo]
    assert all(t and all(isinstance(x, str) for x in t) for t in alone)
    with slow_steps(small), ThreadPoolExecutor(len(todo)) as pool:
        t0 = time.time()
        replies = list(pool.map(lambda pb: call(small, "POST", *pb), todo))
        assert time.time() - t0 > 1.0  # the requests did wait
    assert [text_of(path, body, r) for (path, body), r in zip(todo, replies, strict=True)] == alone
    assert idle(small)


def test_one_request_alone_on_a_slow_step(small):
    with slow_steps(small, 0.6):  # every step longer than the old 0.5 s wait
        r = call(small, "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 3, "seed": 1})
    assert r.status == 200 and r.json()["choices"][0]["finish_reason"] == "length"
    assert r.json()["usage"]["completion_tokens"] == 3


def _open(server, path: str, body: dict) -> socket.socket:
    """Send a request and return the socket without reading the answer."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def test_a_gone_non_streaming_client_cancels_its_tasks_and_its_queued_tasks_never_start(small):
    engine = small.state.engine
    long = {"prompt": "Count:", "n_predict": 200, "ignore_eos": True, "seed": 1}
    with slow_steps(small, 0.05):
        busy = [_open(small, "/completion", {**long, "stream": True}) for _ in range(2)]
        deadline = time.time() + 10
        while not all(s.busy for s in engine.slots) and time.time() < deadline:
            time.sleep(0.02)
        served = sum(s.n_served for s in engine.slots)
        queued = _open(small, "/completion", long)  # waits for a slot
        _wait_until(lambda: engine.n_deferred == 1)
        queued.close()  # gone while queued: dropped at a disconnect poll, while both slots are still busy
        _wait_until(lambda: engine.n_deferred == 0)
        assert all(s.busy for s in engine.slots)
        for s in busy:
            s.close()
        assert idle(small)
        # the two streams ran (and were cut); the queued task never took a slot
        assert sum(s.n_served for s in engine.slots) == served + 2
        running = _open(small, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 200, "seed": 2})
        deadline = time.time() + 10
        while not any(s.busy for s in engine.slots) and time.time() < deadline:
            time.sleep(0.02)
        running.close()  # gone while it generates: cancelled at the next poll, not run to max_tokens
        assert idle(small, 3.0)
    assert all(s.last_task["n_decoded"] < 200 for s in engine.slots)


# --- bad input: a 4xx with llama-server's error body, quickly, never a 500 --------------------------------------

DEEP = 10_000
BAD = [
    ("/completion", b"[" * DEEP + b"]" * DEEP, 400, "nested more than 64 levels"),
    ("/completion", ('{"prompt": "x", "a": ' + "[" * 100 + "]" * 100 + "}").encode(), 400, "nested more than 64"),
    ("/completion", b"{not json", 400, "[json.exception.parse_error]"),
    ("/completion", b'{"prompt": "\xff\xfe"}', 400, "[json.exception.parse_error]"),
    ("/completion", b'{"prompt": NaN}', 400, "[json.exception.parse_error] NaN is not JSON"),
    ("/tokenize", b'{"content": "\\ud800x"}', 400, "lone UTF-16 surrogate (U+D800)"),
    ("/completion", b'{"prompt": "x", "temperature": 1e400}', 400, "the number 1e400 is out of range"),
    ("/completion", b'{"prompt": "x", "t_max_predict_ms": ' + b"9" * 400 + b"}", 400, "is out of range"),
    ("/completion", b'{"prompt": "\\udfff"}', 400, "lone UTF-16 surrogate (U+DFFF)"),
]


@pytest.mark.parametrize("path, raw, status, message", BAD)
def test_bad_bodies_are_400(small, path, raw, status, message):
    t0 = time.process_time()  # the server runs in this process: its work, whatever else loads the machine
    r = call(small, "POST", path, raw=raw)
    assert time.process_time() - t0 < 2.0
    assert r.status == status, r.body
    err = r.json()["error"]
    assert err["code"] == status and err["type"] == "invalid_request_error" and message in err["message"], err


BAD_FIELDS = [
    ({"json_schema": {"enum": list(range(100_000))}}, "Field 'json_schema': an enum has 100000 values, more than 1024"),
    ({"json_schema": {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(3000)}}},
     "Field 'json_schema': the schema has more than 4096 values"),
    ({"json_schema": {"enum": [f"v{i}" for i in range(2000)]}}, "an enum has 2000 values, more than 1024"),
    ({"json_schema": {"enum": ["x" * 70_000]}}, "more than 65536 characters of text (limit MAX_GRAMMAR_CHARS)"),
    ({"grammar": "root ::= " + " | ".join(f'"w{i}"' for i in range(20_000))},
     "Field 'grammar': at most 65536 characters"),
    ({"dry_multiplier": 0.8, "dry_sequence_breakers": ["x" * 1000] * 10_000},
     "Field 'dry_sequence_breakers': at most 32 breakers, got 10000"),
    ({"logit_bias": {"-1": 1}}, "Field 'logit_bias': logit_bias token id must be >= 0, got -1"),
    ({"logit_bias": {"15": "lots"}}, "Field 'logit_bias': logit_bias of 15 must be a number, got 'lots'"),
    ({"logit_bias": 7}, "Field 'logit_bias': logit_bias must be a list of [token, bias] pairs or an object"),
    ({"logit_bias": [[49152, 1]]}, "49152"),
    ({"stop": ""}, "Field 'stop': a stop string must not be empty"),
    ({"stop": ["a", ""]}, "Field 'stop': a stop string must not be empty"),
    ({"stop": ["s"] * 17}, "Field 'stop': at most 16 stop strings, got 17"),
    ({"stop": "x" * 300}, "Field 'stop': a stop string has at most 256 characters, got 300"),
    ({"logit_bias": [["x" * 70_000, 1]]}, "Field 'logit_bias': at most 65536 characters of text, got 70000"),
    ({"generation_prompt": "x" * 70_000}, "Field 'generation_prompt': at most 65536 characters of text"),
    ({"grammar_lazy": True, "grammar": 'root ::= "a"', "grammar_triggers": [{"type": 1, "value": "ab"}] * 17},
     "Field 'grammar_triggers': at most 16 triggers, got 17"),
]


BASES = {"/completion": {"prompt": "Hi"}, "/v1/completions": {"prompt": "Hi"},
         "/v1/chat/completions": {"messages": CHAT}, "/v1/messages": {"messages": CHAT, "max_tokens": 2},
         "/v1/responses": {"input": "Hi"}}


@pytest.mark.parametrize("route", list(BASES))
@pytest.mark.parametrize("fields, message", BAD_FIELDS)
def test_costly_or_malformed_fields_are_400_within_2_s(small, route, fields, message):
    # llama.cpp's sampling fields pass through every generation route, Anthropic's and Responses' too, with the
    # same limits (the error in the route's own shape)
    for stream in (False, True):
        t0 = time.process_time()  # the server's work (it runs in this process), not the machine's load
        r = call(small, "POST", route, {**BASES[route], **fields, "n_predict": 2, "stream": stream})
        assert time.process_time() - t0 < 2.0
        assert r.status == 400, r.body[:300]
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and message in err["message"], err["message"][:300]
        assert (r.json().get("type") == "error") == (route == "/v1/messages")  # Anthropic's {"type": "error"}
    assert idle(small, 1.0)


@pytest.mark.parametrize("route", ["/completion", "/v1/completions", "/v1/chat/completions"])
def test_a_schema_800_deep_is_400(small, route):
    schema = '{"type": "object", "properties": {"a": ' * 800 + '{"type": "string"}' + "}}" * 800
    base = '"messages": [{"role": "user", "content": "Hi"}]' if route == "/v1/chat/completions" else '"prompt": "Hi"'
    r = call(small, "POST", route, raw=f'{{{base}, "json_schema": {schema}}}'.encode())
    assert r.status == 400
    assert r.json()["error"]["message"] == ("[json.exception.parse_error] the request body is nested more than 64 "
                                            "levels deep")


def test_too_many_messages(small):
    r = call(small, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": ""}] * 5000})
    assert r.status == 400
    assert r.json()["error"]["message"] == "Field 'messages': at most 4096 messages, got 5000"


def test_a_stream_starts_before_every_task_has_a_slot(small):
    """3 prompts on 2 slots: the stream starts with the first tokens, and the third prompt's task runs after."""
    with slow_steps(small, 0.05):
        r = call(small, "POST", "/completion", {"prompt": ["One", "Two", "Three"], "n_predict": 4, "seed": 1,
                                                "stream": True})
    events = r.events()
    finals = sorted(e["index"] for e in events if e["stop"])
    assert r.status == 200 and finals == [0, 1, 2]
    assert all(len([e for e in events if e["index"] == i and not e["stop"]]) == 4 for i in range(3))


def test_a_page_of_another_site_cannot_use_the_server(small):
    """Without a preflight (a text/plain POST), a foreign page's request would still start work: it is a 403.
    The server's own page (same origin, whatever its address) and loopback pages are served."""
    body = json.dumps({"prompt": "Hi", "n_predict": 1}).encode()
    r = call(small, "POST", "/completion", raw=body, headers={"Origin": "https://evil.example",
                                                            "Content-Type": "text/plain"})
    assert r.status == 403
    assert r.json()["error"] == {"code": 403, "message": "Origin 'https://evil.example' is not allowed (see "
                                 "--cors-origins)", "type": "permission_error"}
    assert call(small, "POST", "/completion", raw=body, headers={"Origin": "http://localhost:3000"}).status == 200
    same = f"http://127.0.0.1:{small.port}"
    assert call(small, "POST", "/completion", raw=body, headers={"Origin": same}).status == 200
    r = call(small, "POST", "/completion", raw=body, headers={"Origin": "http://192.168.1.5:8080",
                                                            "Host": "192.168.1.5:8080"})
    assert r.status == 200  # its own page, reached over the network
    assert call(small, "GET", "/health", headers={"Origin": "https://evil.example"}).status == 200


def test_too_many_prompts_and_too_long_prompts(small):
    r = call(small, "POST", "/completion", {"prompt": ["p"] * 2000, "n_predict": 1})
    assert r.status == 400
    assert r.json()["error"]["message"] == ("Field 'prompt': a request may start at most 256 completions "
                                            "(prompts x n), got 2000 x 1")
    n = prompts.max_prompt_chars(small.state.model, 256) + 1
    t0 = time.process_time()  # the server's work (it runs in this process), not the machine's load
    r = call(small, "POST", "/completion", {"prompt": "a" * n, "n_predict": 1})
    assert time.process_time() - t0 < 2.0 and r.status == 400
    err = r.json()["error"]
    assert err["type"] == "exceed_context_size_error" and err["n_ctx"] == 256
    assert err["message"].startswith(f"request ({n} characters) exceeds the available context size (256 tokens)")
    r = call(small, "POST", "/tokenize", {"content": "a" * (limits.MAX_TOKENIZE_CHARS + 1)})
    assert r.status == 400 and r.json()["error"]["message"].startswith("Field 'content': at most")


def test_a_grammar_over_its_compile_budget_is_400(small, monkeypatch):
    grammar = "root ::= " + " | ".join(f'"w{i}"' for i in range(3000))  # within the size limit, ~1 s of work
    monkeypatch.setattr(limits, "COMPILE_BUDGET", 0.01)
    r = call(small, "POST", "/completion", {"prompt": "Hi", "grammar": grammar, "n_predict": 2})
    assert r.status == 400
    assert "the grammar took more than the compile time budget of 0.01 s" in r.json()["error"]["message"]
    monkeypatch.setattr(limits, "COMPILE_BUDGET", 30.0)
    r = call(small, "POST", "/completion", {"prompt": "Hi", "grammar": grammar, "n_predict": 2, "temperature": 0})
    assert r.status == 200 and r.json()["content"].startswith("w")


def test_the_compiled_grammar_is_shared_by_the_choices(small):
    body = {"messages": CHAT, "max_tokens": 8, "seed": 3, "n": 2,
            "response_format": {"type": "json_schema", "json_schema": {"schema": {"enum": ["red", "green", "blue"]}}}}
    r = call(small, "POST", "/v1/chat/completions", body)
    assert r.status == 200
    assert {c["message"]["content"] for c in r.json()["choices"]} <= {'"red"', '"green"', '"blue"'}


# --- slow connections ------------------------------------------------------------------------------------------


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while sock.recv(1024):
            pass
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_slow_request_heads_and_silent_bodies_are_closed(small):
    """head_timeout 1 s, timeout 2 s on this server: a request head that trickles in (slowloris), a connection
    that sends nothing, and a body that stops are closed; a prompt client is served meanwhile."""
    heads = []
    for _ in range(16):
        s = socket.create_connection(("127.0.0.1", small.port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        heads.append(s)
    silent = socket.create_connection(("127.0.0.1", small.port))
    body = socket.create_connection(("127.0.0.1", small.port))
    body.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"")
    assert call(small, "GET", "/health").status == 200
    for s in heads[:4]:  # a byte at a time does not keep a head alive past its deadline
        s.sendall(b"X")
    t0 = time.time()
    assert all(_closed_within(s, 3.0) for s in heads)
    assert _closed_within(silent, 3.0)
    assert _closed_within(body, 4.0)
    assert time.time() - t0 < 6.0
    for s in [*heads, silent, body]:
        s.close()


# --- shutdown --------------------------------------------------------------------------------------------------


def _stream(server, body: dict, out: dict, key: str) -> None:
    r = call(server, "POST", "/v1/chat/completions", {**body, "stream": True})
    out[key] = r


def test_shutdown_finishes_running_streams_within_the_grace_and_cuts_the_rest(smol):
    server = BackgroundServer(ServerConfig(port=0, n_slots=2, n_ctx=512, shutdown_grace=1.0), smol)
    try:
        engine = server.state.engine
        # slow steps until the third request waits (the short one cannot finish before it is seen running), then
        # fast ones: what is left of the short stream takes far less than the grace
        engine.step_hook = lambda: time.sleep(0.3)
        out: dict = {}
        long = {"messages": CHAT, "max_tokens": 400, "ignore_eos": True, "seed": 1}
        short = {"messages": CHAT, "max_tokens": 4, "seed": 2}
        threads = [threading.Thread(target=_stream, args=(server, long, out, "long"))]
        threads[0].start()
        _wait_until(lambda: any(x.busy for x in engine.slots))
        threads.append(threading.Thread(target=_stream, args=(server, short, out, "short")))
        threads.append(threading.Thread(target=_stream, args=(server, long, out, "queued")))
        threads[1].start()
        _wait_until(lambda: all(x.busy for x in engine.slots))
        threads[2].start()
        _wait_until(lambda: engine.n_deferred == 1)
        engine.step_hook = lambda: time.sleep(0.02)
        t0 = time.time()
        server.shutdown()
        assert time.time() - t0 < 1.0 + 5.0  # the grace, and room for a loaded machine (400 steps take > 8 s)
        for t in threads:
            t.join(5)
    finally:
        server.close()
    # the short stream finished normally within the grace period
    events = out["short"].events()
    assert events[-1] == "[DONE]" and [e for e in events if e != "[DONE]" and "error" in e] == []
    # the long one was cut at the end of the grace period: its finish reason, then the error
    events = out["long"].events()
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1] == {"error": {"code": 503, "message": "the server is shutting down",
                                    "type": "unavailable_error"}}
    # the queued one never started: its answer is the error
    assert out["queued"].status == 503
    assert out["queued"].json()["error"]["message"] == "the server is shutting down"


def test_shutdown_cuts_anthropic_and_responses_streams_with_an_error_event_in_their_shape(smol):
    server = BackgroundServer(ServerConfig(port=0, n_slots=2, n_ctx=512, shutdown_grace=0.5), smol)
    try:
        engine = server.state.engine
        engine.step_hook = lambda: time.sleep(0.05)
        out: dict = {}
        bodies = {"/v1/messages": {"messages": CHAT, "max_tokens": 400, "ignore_eos": True, "stream": True},
                  "/v1/responses": {"input": CHAT, "max_output_tokens": 400, "ignore_eos": True, "stream": True}}
        threads = [threading.Thread(target=lambda p=p: out.__setitem__(p, call(server, "POST", p, bodies[p])))
                   for p in bodies]
        for t in threads:
            t.start()
        _wait_until(lambda: all(x.busy for x in engine.slots))
        server.shutdown()
        for t in threads:
            t.join(10)
    finally:
        server.close()
    anthropic = out["/v1/messages"].events()
    assert anthropic[0]["type"] == "message_start"
    assert anthropic[-1] == {"type": "error", "error": {"type": "overloaded_error",
                                                        "message": "the server is shutting down"}}
    responses = out["/v1/responses"].events()
    assert responses[0]["type"] == "response.created"
    assert [e["type"] for e in responses[-2:]] == ["error", "response.failed"]
    assert responses[-2]["message"] == "the server is shutting down"


def test_sigterm_exits_0_within_the_grace_and_every_client_gets_a_final_event(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "samplechain", "serve", "--port", str(port), "-np", "2",
                             "-c", "4096", "--shutdown-grace", "2"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        class Server:
            pass

        server = Server()
        server.port = port
        deadline = time.time() + 120
        while True:
            try:
                if call(server, "GET", "/health").status == 200:
                    break
            except OSError:
                pass
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.2)
        out: dict = {}
        long = {"messages": CHAT, "max_tokens": 5000, "ignore_eos": True, "seed": 1}
        threads = [threading.Thread(target=_stream, args=(server, long, out, f"s{i}")) for i in range(3)]
        for t in threads:
            t.start()
        deadline = time.time() + 60
        while sum(x["is_processing"] for x in call(server, "GET", "/slots").json()) < 2:
            assert time.time() < deadline
            time.sleep(0.1)
        time.sleep(0.5)
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=15)
        elapsed = time.time() - t0
        for t in threads:
            t.join(5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stderr = proc.stderr.read()
    assert rc == 0, stderr[-2000:]
    assert elapsed < 2 + 10, elapsed  # the grace, and room for a loaded machine (5000 tokens take minutes)
    assert "Traceback" not in stderr and "CancelledError" not in stderr, stderr[-2000:]
    finished = 0
    for key in ("s0", "s1", "s2"):
        r = out[key]
        if r.status == 503:  # queued when the signal came
            assert r.json()["error"]["message"] == "the server is shutting down"
            continue
        events = r.events()
        assert events[-2]["choices"][0]["finish_reason"] == "length" and events[-1]["error"]["code"] == 503
        finished += 1
    assert finished == 2


def test_a_chunked_body_past_the_limit_is_413(small, monkeypatch):
    monkeypatch.setattr(limits, "MAX_BODY", 1 << 20)  # the limit applies to what is read, Content-Length or not
    sock = socket.create_connection(("127.0.0.1", small.port))
    sock.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b'{"prompt": "' + b"a" * (64 << 10)
    try:
        for _ in range(17):  # just past 1 MiB: the server reads it all, so no unread byte resets the connection
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            chunk = b"a" * (64 << 10)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered and closed before the rest
    sock.settimeout(10)
    answer = b""
    while b'"type":"invalid_request_error"}}' not in answer:
        data = sock.recv(4096)
        if not data:
            break
        answer += data
    sock.close()
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b'"message":"Payload Too Large"' in answer


class _Clock:
    """A loop that only keeps time and timers, for the connection watchdog."""

    def __init__(self) -> None:
        self.now, self.timers = 0.0, []

    def time(self) -> float:
        return self.now

    def call_later(self, delay, callback):
        timer = [self.now + delay, callback, False]
        self.timers.append(timer)

        class Handle:
            def cancel(self) -> None:
                timer[2] = True
        return Handle()

    def create_task(self, coro):  # the request's app never runs here
        coro.close()

        class Task:
            def add_done_callback(self, callback) -> None:
                pass
        return Task()

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while True:
            due = [t for t in self.timers if not t[2] and t[0] <= end]
            if not due:
                break
            timer = min(due, key=lambda t: t[0])
            timer[2] = True
            self.now = timer[0]
            timer[1]()
        self.now = end


class _Transport:
    def __init__(self) -> None:
        self.closed = self.aborted = False

    def get_extra_info(self, name, default=None):
        return default

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def write(self, data) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _connection(head_timeout: float = 10.0, io_timeout: float = 600.0):
    import uvicorn
    from uvicorn.server import ServerState as UvicornState

    from samplechain.server.connection import timed

    async def app(scope, receive, send):
        pass

    clock, transport = _Clock(), _Transport()
    protocol = timed(head_timeout, io_timeout)(config=uvicorn.Config(app, log_level="error"),
                                               server_state=UvicornState(), app_state={}, _loop=clock)
    protocol.connection_made(transport)
    return clock, transport, protocol


def test_a_client_that_reads_nothing_is_cut_after_the_write_timeout():
    clock, transport, protocol = _connection(io_timeout=5.0)
    protocol.data_received(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")  # a request in progress: no head deadline
    clock.advance(20.0)
    assert not transport.is_closing()
    protocol.pause_writing()  # the client stopped reading: the transport's buffer is full
    clock.advance(4.0)
    protocol.resume_writing()  # it read again in time
    clock.advance(4.0)
    assert not transport.is_closing()
    protocol.pause_writing()
    clock.advance(6.0)
    assert transport.aborted  # its buffered writes would never drain


def test_the_watchdog_clocks():
    clock, transport, protocol = _connection(head_timeout=3.0)
    clock.advance(2.5)
    protocol.data_received(b"GET /health HTTP/1.1\r\n")  # a byte now and then does not reset the head deadline
    clock.advance(1.0)
    assert transport.closed
    clock, transport, protocol = _connection(head_timeout=3.0, io_timeout=5.0)
    protocol.data_received(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{")
    clock.advance(3.0)
    protocol.data_received(b'"a')  # a body that trickles in has io_timeout seconds in all
    clock.advance(1.5)
    assert not transport.is_closing()
    clock.advance(1.5)
    assert transport.closed
    clock, transport, protocol = _connection(head_timeout=3.0, io_timeout=5.0)
    protocol.data_received(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: 13\r\n\r\n{")
    clock.advance(1.0)
    protocol.data_received(b'"prompt": 1}')  # complete: the request is being answered, no clock runs
    assert protocol.conn.their_state is h11.DONE
    clock.advance(60.0)
    assert not transport.is_closing()


def test_extreme_but_valid_numbers_answer_with_null_not_500(small):
    """A penalty of -1e308 or a bias of 1e308 makes logits infinite: the answer carries null where JSON has no
    number (as llama-server's JSON library writes it), never a 500."""
    r = call(small, "POST", "/completion", {"prompt": "Hi", "n_predict": 2, "repeat_penalty": 1.5,
                                            "frequency_penalty": -1e308, "seed": 1})
    assert r.status == 200 and r.json()["tokens_predicted"] == 2
    r = call(small, "POST", "/sampling/trace", {"prompt": "Hi", "logit_bias": [[1, 1e308]]})
    assert r.status == 200
    assert r.json()["steps"][0]["token"] == 1


def test_a_chain_the_request_leaves_no_token_is_400(small):
    """A grammar whose only token is outside the vocabulary: the sampling chain cannot go on, which is the
    request's doing (a 400), not the server's (it was a 500)."""
    r = call(small, "POST", "/completion", {"prompt": "x", "n_predict": 4, "grammar": "root ::= <[99999999]>"})
    assert r.status == 400
    assert r.json()["error"] == {"code": 400, "message": "dist: every candidate is masked (-inf); nothing can be "
                                 "drawn", "type": "invalid_request_error"}
    assert idle(small, 2.0)


def test_legacy_completions_answer_every_prompt(small):
    body = {"prompt": ["The capital of France is", "def fib(n):"], "max_tokens": 3, "seed": 1, "n": 2}
    r = call(small, "POST", "/v1/completions", body)
    assert r.status == 200 and [c["index"] for c in r.json()["choices"]] == [0, 1, 2, 3]
    alone = call(small, "POST", "/v1/completions", {**body, "prompt": "def fib(n):", "n": 1}).json()
    assert r.json()["choices"][2]["text"] == alone["choices"][0]["text"]
    events = call(small, "POST", "/v1/completions", {**body, "stream": True}).events()
    assert sorted({c["index"] for e in events if e != "[DONE]" for c in e["choices"]}) == [0, 1, 2, 3]
