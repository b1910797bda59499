"""``samplechain.integrations.ray_serve``: 2 replicas behind the front deployment, on a local loopback Ray.

The replica-failure test kills a replica, so it is the last of this module (pytest keeps the file's order)."""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests_ray.conftest import descendants, listeners, on_loopback

REPLICA = "x-samplechain-replica"
TIMEOUT = httpx.Timeout(180.0, connect=10.0)


def chat(messages, **extra):
    return {"messages": messages, "max_tokens": 12, "seed": 42, "temperature": 0.8, **extra}


def post(url, path, body, headers=None):
    return httpx.post(url + path, json=body, headers=headers or {}, timeout=TIMEOUT)


def events(raw: bytes) -> list[tuple[str | None, str]]:
    """Server-sent events as (event name or None, data)."""
    out = []
    for block in raw.decode().split("\n\n"):
        name, data = None, []
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        if data:
            out.append((name, "\n".join(data)))
    return out


def stream(url, path, body, headers=None) -> tuple[int, dict, bytes]:
    with httpx.stream("POST", url + path, json={**body, "stream": True}, headers=headers or {},
                      timeout=TIMEOUT) as r:
        return r.status_code, dict(r.headers), r.read()


def chat_stream_text(raw: bytes) -> tuple[str, dict | None]:
    text, use = "", None
    for _, data in events(raw):
        if data == "[DONE]":
            continue
        obj = json.loads(data)
        for c in obj.get("choices", []):
            text += c["delta"].get("content") or ""
        use = obj.get("usage") or use
    return text, use


# --- the cluster -------------------------------------------------------------------------------------------------


def test_every_ray_socket_listens_on_loopback_only(cluster):
    mine = listeners(descendants(os.getpid()))
    assert len(mine) >= 8, mine  # gcs, raylet, the agents, Serve's proxy and controller, the replicas
    assert [s for s in mine if not on_loopback(s[0])] == []
    assert any(local.endswith(f":{cluster.port}") for local, _ in mine)  # Serve's HTTP proxy


def test_health_slots_and_metrics_name_the_replica_that_answered(cluster):
    replicas = cluster.replicas()
    assert len(replicas) == 2 and replicas[0]["replica"] != replicas[1]["replica"]
    for r in replicas:
        pin = {"X-Samplechain-Replica": r["replica"]}
        health = httpx.get(cluster.url + "/health", headers=pin, timeout=TIMEOUT)
        assert health.status_code == 200 and health.headers[REPLICA] == r["replica"]
        assert health.json() == {"status": "ok", "replica": r["replica"], "node": "127.0.0.1", "pid": r["pid"]}
        slots = httpx.get(cluster.url + "/slots", headers=pin, timeout=TIMEOUT).json()
        assert [(s["id"], s["replica"], s["n_ctx"]) for s in slots] == [(i, r["replica"], 1024) for i in range(5)]
        metrics = httpx.get(cluster.url + "/metrics", headers=pin, timeout=TIMEOUT)
        assert metrics.status_code == 200 and metrics.headers[REPLICA] == r["replica"]
        assert (f'samplechain:replica_info{{replica="{r["replica"]}",node="127.0.0.1",pid="{r["pid"]}"}} 1'
                in metrics.text.splitlines())
        assert "llamacpp:prompt_tokens_total" in metrics.text


def test_errors_keep_their_api_shape_through_the_front(cluster):
    r = post(cluster.url, "/v1/chat/completions", {"messages": "not a list"})
    assert r.status_code == 400 and r.json()["error"]["code"] == 400 and REPLICA in r.headers
    r = post(cluster.url, "/v1/messages", {"model": "m", "max_tokens": 4})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.get(cluster.url + "/nope", timeout=TIMEOUT)
    assert r.status_code == 404 and r.json()["error"] == {"code": 404, "message": "File Not Found",
                                                          "type": "not_found_error"}


def test_same_seed_gives_the_same_text_on_both_replicas(cluster):
    body = chat([{"role": "user", "content": "Write one line about the sea."}], max_tokens=16)
    got = {}
    for r in cluster.replicas():
        answer = post(cluster.url, "/v1/chat/completions", body, {"X-Samplechain-Replica": r["replica"]})
        assert answer.status_code == 200 and answer.headers[REPLICA] == r["replica"]
        got[r["replica"]] = answer.json()["choices"][0]["message"]["content"]
    texts = list(got.values())
    assert len(texts) == 2 and texts[0] == texts[1] and texts[0]


def test_concurrent_streaming_and_non_streaming_requests_on_both_replicas(cluster):
    """16 at once: Chat Completions, llama-server's /completion, Anthropic Messages, Responses, each streamed and
    not, half pinned to each replica; every answer 200, and each stream's text is its non-streamed twin's."""
    replicas = [r["replica"] for r in cluster.replicas()]
    jobs = []
    for i in range(2):
        pin = {"X-Samplechain-Replica": replicas[i]}
        content = f"Tell me a fact about the number {i + 3}."
        jobs += [("/v1/chat/completions", chat([{"role": "user", "content": content}],
                                               stream_options={"include_usage": True}), pin),
                 ("/completion", {"prompt": f"The number {i + 3} is", "n_predict": 12, "seed": 42}, pin),
                 ("/v1/messages", {"model": "m", "max_tokens": 12, "messages": [{"role": "user", "content": content}],
                                   "temperature": 0}, pin),
                 ("/v1/responses", {"input": content, "max_output_tokens": 12, "temperature": 0}, pin)]

    def one(args):
        (path, body, headers), streamed = args
        if streamed:
            return stream(cluster.url, path, body, headers)
        r = post(cluster.url, path, {k: v for k, v in body.items() if k != "stream_options"}, headers)
        return r.status_code, dict(r.headers), r.content

    work = [(job, streamed) for job in jobs for streamed in (False, True)]
    started = time.monotonic()
    with ThreadPoolExecutor(len(work)) as pool:
        results = list(pool.map(one, work))
    assert time.monotonic() - started < 300
    assert [status for status, _, _ in results] == [200] * 16
    for ((_, _, headers), streamed), (_, got_headers, _) in zip(work, results, strict=True):
        assert got_headers[REPLICA] == headers["X-Samplechain-Replica"]
        assert got_headers["content-type"].startswith("text/event-stream" if streamed else "application/json")
    for k in range(0, 16, 2):
        (path, _, _), _ = work[k]
        plain, streamed = results[k][2], results[k + 1][2]
        if path == "/v1/chat/completions":
            text, use = chat_stream_text(streamed)
            whole = json.loads(plain)
            assert text == whole["choices"][0]["message"]["content"]
            assert use["completion_tokens"] == whole["usage"]["completion_tokens"]
            tokens = [e for e in events(streamed) if e[1] != "[DONE]" and json.loads(e[1]).get("choices")
                      and json.loads(e[1])["choices"][0]["delta"].get("content")]
            assert 1 < len(tokens) <= whole["usage"]["completion_tokens"]  # a chunk per token, not one at the end
        elif path == "/completion":
            chunks = [json.loads(d) for _, d in events(streamed)]
            assert "".join(c["content"] for c in chunks) == json.loads(plain)["content"]
            assert len(chunks) == json.loads(plain)["tokens_predicted"] + 1  # each token, then the final one
        elif path == "/v1/messages":
            names = [n for n, _ in events(streamed)]
            assert names[0] == "message_start" and names[-1] == "message_stop"
            text = "".join(json.loads(d)["delta"].get("text", "") for n, d in events(streamed)
                           if n == "content_block_delta")
            assert text == json.loads(plain)["content"][0]["text"]
        else:
            names = [n for n, _ in events(streamed)]
            assert names[0] == "response.created" and names[-1] in ("response.completed", "response.incomplete")


# --- affinity ----------------------------------------------------------------------------------------------------


def test_a_conversation_stays_on_the_replica_that_holds_its_cache(cluster):
    """6 conversations of 3 turns (each its own system prompt): every later turn reaches its first turn's replica
    and reuses the whole conversation so far (cached = the previous prompt and answer, less the last token)."""
    seen = set()
    for c in range(6):
        messages = [{"role": "system", "content": f"You are assistant number {c}. Answer briefly."},
                    {"role": "user", "content": f"Say something about the colour {['red', 'blue', 'green'][c % 3]}."}]
        first, previous = None, None
        for turn in range(3):
            r = post(cluster.url, "/v1/chat/completions", chat(messages, temperature=0))
            assert r.status_code == 200
            replica, use = r.headers[REPLICA], r.json()["usage"]
            first = first or replica
            assert replica == first, (c, turn)
            if previous is not None:
                assert use["prompt_tokens_details"]["cached_tokens"] == (previous["prompt_tokens"]
                                                                         + previous["completion_tokens"] - 1)
            previous = use
            messages = [*messages, r.json()["choices"][0]["message"],
                        {"role": "user", "content": f"And then? ({turn})"}]
        seen.add(first)
    assert seen <= {r["replica"] for r in cluster.replicas()}


def test_an_explicit_conversation_id_or_user_keeps_the_replica(cluster):
    for header, field in (({"X-Conversation-Id": "conversation-7"}, {}), ({}, {"user": "user-42"})):
        got = set()
        for i in range(4):
            r = post(cluster.url, "/v1/chat/completions",
                     chat([{"role": "user", "content": f"Unrelated question {i}?"}], max_tokens=4, **field), header)
            assert r.status_code == 200
            got.add(r.headers[REPLICA])
        assert len(got) == 1


def test_anthropic_and_responses_conversations_stay_on_their_replica(cluster):
    messages = [{"role": "user", "content": "Name a planet."}]
    first = None
    for turn in range(3):
        r = post(cluster.url, "/v1/messages", {"model": "m", "max_tokens": 6, "temperature": 0,
                                               "system": "You are an astronomer.", "messages": messages})
        assert r.status_code == 200
        first = first or r.headers[REPLICA]
        assert r.headers[REPLICA] == first
        if turn:
            assert r.json()["usage"]["cache_read_input_tokens"] > 0
        messages = [*messages, {"role": "assistant", "content": r.json()["content"][0]["text"]},
                    {"role": "user", "content": "Another?"}]
    # previous_response_id is kept by the replica that answered: the front sends the next turn there
    r = post(cluster.url, "/v1/responses", {"input": "Name a river.", "max_output_tokens": 6, "temperature": 0})
    assert r.status_code == 200
    first, rid = r.headers[REPLICA], r.json()["id"]
    for _ in range(3):
        r = post(cluster.url, "/v1/responses", {"input": "Another one.", "previous_response_id": rid,
                                                "max_output_tokens": 6, "temperature": 0})
        assert r.status_code == 200 and r.headers[REPLICA] == first
        assert r.json()["usage"]["input_tokens_details"]["cached_tokens"] > 0
        rid = r.json()["id"]
    got = httpx.get(cluster.url + f"/v1/responses/{rid}", timeout=TIMEOUT)
    assert got.status_code == 200 and got.json()["id"] == rid and got.headers[REPLICA] == first


# --- a replica dies under load (last: it changes the cluster) -----------------------------------------------------


def test_a_replica_killed_under_load(cluster):
    """SIGKILL one replica while both generate: the survivor's requests finish; each of the victim's running
    requests ends with a 503 in its API's shape (a JSON body, or a stream's last event); requests sent after the kill
    are answered by the survivor; Serve starts a replacement; nothing hangs."""
    victim, survivor = cluster.replicas()
    long = {"ignore_eos": True, "temperature": 0}
    user = [{"role": "user", "content": "Count to one hundred."}]

    def load(pin: str):
        h = {"X-Samplechain-Replica": pin}
        return [("post", "/v1/chat/completions", chat(user, max_tokens=300, **long), h),
                ("stream", "/v1/chat/completions", chat(user, max_tokens=300, **long), h),
                ("stream", "/v1/messages", {"model": "m", "max_tokens": 300, "messages": user, **long}, h),
                ("stream", "/v1/responses", {"input": "Count to one hundred.", "max_output_tokens": 300, **long}, h),
                ("post", "/v1/messages", {"model": "m", "max_tokens": 300, "messages": user, **long}, h)]

    first_chunk = {}

    def one(job):
        kind, path, body, headers = job
        t0 = time.monotonic()
        if kind == "post":
            r = post(cluster.url, path, body, headers)
            return r.status_code, dict(r.headers), r.content, time.monotonic() - t0
        with httpx.stream("POST", cluster.url + path, json={**body, "stream": True}, headers=headers,
                          timeout=TIMEOUT) as r:
            raw = b""
            for chunk in r.iter_raw():
                raw += chunk
                if headers["X-Samplechain-Replica"] == victim["replica"]:
                    first_chunk.setdefault(path, time.monotonic())
            return r.status_code, dict(r.headers), raw, time.monotonic() - t0

    jobs = load(victim["replica"]) + load(survivor["replica"])
    with ThreadPoolExecutor(len(jobs) + 4) as pool:
        running = [pool.submit(one, job) for job in jobs]
        deadline = time.monotonic() + 120
        pin = {"X-Samplechain-Replica": victim["replica"]}
        while time.monotonic() < deadline:  # the victim's 5 requests all generate (a slot each)
            slots = httpx.get(cluster.url + "/slots", headers=pin, timeout=TIMEOUT).json()
            if all(s["is_processing"] for s in slots) and len(first_chunk) >= 3:
                break
            time.sleep(0.1)
        assert all(s["is_processing"] for s in slots) and len(slots) == 5
        time.sleep(0.5)
        os.kill(victim["pid"], signal.SIGKILL)
        killed = time.monotonic()
        # sent after the kill, meant for the dead replica: no replica has started them, so the survivor answers
        after = [pool.submit(one, ("post", "/v1/chat/completions",
                                   chat([{"role": "user", "content": f"Quick {i}."}], max_tokens=4),
                                   {"X-Samplechain-Replica": victim["replica"]})) for i in range(4)]
        results = [f.result(timeout=240) for f in running]
        later = [f.result(timeout=240) for f in after]
    assert time.monotonic() - killed < 240

    for (kind, path, _, _), (status, headers, raw, _) in zip(jobs[5:], results[5:], strict=True):
        assert status == 200 and headers[REPLICA] == survivor["replica"], (path, raw[-300:])
        names = [n for n, _ in events(raw)] if kind == "stream" else []
        if kind == "post":
            assert json.loads(raw)  # a whole answer
        elif path == "/v1/chat/completions":
            assert events(raw)[-1][1] == "[DONE]"
        elif path == "/v1/messages":
            assert names[-1] == "message_stop"
        else:
            assert names[-1] in ("response.completed", "response.incomplete")
    for (kind, path, _, _), (status, headers, raw, _) in zip(jobs[:5], results[:5], strict=True):
        if kind == "post":
            assert status == 503, raw
            body = json.loads(raw)
            if path == "/v1/messages":
                assert body["type"] == "error" and body["error"]["type"] == "overloaded_error"
                assert victim["replica"] in body["error"]["message"]
            else:
                assert body["error"]["code"] == 503 and body["error"]["type"] == "unavailable_error"
                assert victim["replica"] in body["error"]["message"]
            continue
        assert status == 200 and headers[REPLICA] == victim["replica"]
        name, data = events(raw)[-1]
        if path == "/v1/chat/completions":
            assert name is None and json.loads(data)["error"]["code"] == 503
            assert not any(d == "[DONE]" for _, d in events(raw))
        elif path == "/v1/messages":
            assert name == "error" and json.loads(data)["error"]["type"] == "overloaded_error"
        else:
            names = [n for n, _ in events(raw)]
            assert names[-2:] == ["error", "response.failed"]
            seqs = [json.loads(d)["sequence_number"] for _, d in events(raw)]
            assert seqs == list(range(len(seqs)))  # the failure continues the stream's numbering
            assert json.loads(data)["response"]["status"] == "failed"
            assert json.loads(data)["response"]["id"].startswith("resp_")
    for status, headers, _, _ in later:
        assert status == 200 and headers[REPLICA] == survivor["replica"]

    # Serve replaces the dead replica (bounded wait)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        now = cluster.replicas()
        if len(now) == 2 and victim["replica"] not in {r["replica"] for r in now}:
            break
        time.sleep(1)
    else:
        pytest.fail(f"no replacement replica in 180 s: {cluster.replicas()}")
    fresh = next(r for r in now if r["replica"] != survivor["replica"])
    r = post(cluster.url, "/v1/chat/completions", chat(user, max_tokens=4),
             {"X-Samplechain-Replica": fresh["replica"]})
    assert r.status_code == 200 and r.headers[REPLICA] == fresh["replica"]
