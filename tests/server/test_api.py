"""The HTTP API against a live server: llama-server's shapes (tools/server/server-task.cpp) and the official
openai client."""

import json
import re
import threading
import time

import jsonschema
import pytest
from tests.server.conftest import call, live_server

CHAT = [{"role": "user", "content": "Name three colours."}]


# --- simple routes ------------------------------------------------------------------------------------------


def test_health_models_props(server):
    assert call(server, "GET", "/health").json() == {"status": "ok"}
    models = call(server, "GET", "/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["smol"]
    assert models["data"][0]["meta"]["n_ctx"] == 256 and models["data"][0]["meta"]["n_vocab"] == 49152
    props = call(server, "GET", "/props").json()
    assert props["total_slots"] == 4
    assert props["default_generation_settings"]["n_ctx"] == 256
    assert props["default_generation_settings"]["params"]["top_k"] == 40
    assert props["model_path"].endswith(".gguf") and "/" not in props["model_path"]  # the name, not where it is
    assert props["build_info"].startswith("b")


def test_unknown_route_and_bad_json(server):
    r = call(server, "GET", "/nowhere")
    assert r.status == 404
    assert r.json() == {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}
    r = call(server, "POST", "/completion", raw=b"{not json")
    # llama-server answers 500; a body that is not JSON is the client's error
    assert r.status == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["error"]["message"].startswith("[json.exception.parse_error] Expecting property name")


def test_tokenize_detokenize(server):
    toks = call(server, "POST", "/tokenize", {"content": "Hello world"}).json()["tokens"]
    assert toks == [19556, 905]
    assert call(server, "POST", "/detokenize", {"tokens": toks}).json() == {"content": "Hello world"}
    with_bos = call(server, "POST", "/tokenize", {"content": "Hi", "add_special": True}).json()["tokens"]
    assert with_bos == call(server, "POST", "/tokenize", {"content": "Hi"}).json()["tokens"]  # SmolLM2 adds no BOS
    pieces = call(server, "POST", "/tokenize", {"content": "Hello world", "with_pieces": True}).json()["tokens"]
    assert pieces == [{"id": 19556, "piece": "Hello"}, {"id": 905, "piece": " world"}]
    assert call(server, "POST", "/tokenize", {}).json() == {"tokens": []}


def test_apply_template(server):
    r = call(server, "POST", "/apply-template", {"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert r["prompt"].endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    r = call(server, "POST", "/apply-template", {"messages": [{"role": "user", "content": "Hi"}],
                                                 "add_generation_prompt": False}).json()
    assert r["prompt"].endswith("<|im_start|>user\nHi<|im_end|>\n")


def test_slots_and_metrics(server):
    slots = call(server, "GET", "/slots").json()
    assert [s["id"] for s in slots] == [0, 1, 2, 3]
    assert all(s["n_ctx"] == 256 and s["is_processing"] is False for s in slots)
    call(server, "POST", "/completion", {"prompt": "Hi", "n_predict": 3, "seed": 1})
    text = call(server, "GET", "/metrics").body.decode()
    assert "# TYPE llamacpp:prompt_tokens_total counter" in text
    assert re.search(r"^llamacpp:requests_processing 0$", text, re.M)
    assert re.search(r"^llamacpp:tokens_predicted_total [1-9]", text, re.M)


# --- native completion ----------------------------------------------------------------------------------------


def test_native_completion_stream_equals_non_stream(server):
    body = {"prompt": "The ocean is", "n_predict": 24, "seed": 7, "temperature": 0.8}
    full = call(server, "POST", "/completion", body).json()
    assert full["stop"] is True and full["stop_type"] == "limit" and full["tokens_predicted"] == 24
    assert full["tokens_evaluated"] == 3 and full["truncated"] is False
    assert full["generation_settings"]["seed"] == 7 and full["generation_settings"]["n_predict"] == 24
    assert full["timings"]["predicted_n"] == 24 and full["timings"]["prompt_n"] + full["timings"]["cache_n"] == 3
    r = call(server, "POST", "/completion", {**body, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = r.events()
    assert "[DONE]" not in events
    assert all(e["stop"] is False and len(e["tokens"]) == 1 for e in events[:-1])
    assert events[-1]["stop"] is True and events[-1]["content"] == ""
    assert "".join(e["content"] for e in events[:-1]) == full["content"]


def test_return_tokens_and_response_fields(server):
    r = call(server, "POST", "/completion", {"prompt": "Hi", "n_predict": 4, "seed": 2, "return_tokens": True}).json()
    assert len(r["tokens"]) == 4
    r = call(server, "POST", "/completion", {"prompt": "Hi", "n_predict": 4, "seed": 2,
                                             "response_fields": ["content", "generation_settings/n_predict", "x"]})
    assert set(r.json()) == {"content", "generation_settings/n_predict"}
    assert r.json()["generation_settings/n_predict"] == 4


def test_n_predict_zero_still_samples_one_token(server):
    r = call(server, "POST", "/completion", {"prompt": "Hi", "n_predict": 0, "seed": 2}).json()
    assert r["tokens_predicted"] == 1 and r["stop_type"] == "limit"


def test_stop_string_cuts_the_text(server):
    base = {"prompt": "1, 2, 3, 4,", "n_predict": 12, "temperature": 0}
    free = call(server, "POST", "/completion", base).json()["content"]
    assert free.startswith(" 5, 6, 7")
    r = call(server, "POST", "/completion", {**base, "stop": [" 7", "never"]}).json()
    assert r["content"] == " 5, 6," and r["stop_type"] == "word" and r["stopping_word"] == " 7"
    events = call(server, "POST", "/completion", {**base, "stop": " 7", "stream": True}).events()
    assert "".join(e["content"] for e in events) == " 5, 6,"


def test_prompt_cache_reuses_the_prefix(server):
    body = {"prompt": "A long prompt about the sea and the sky and the land", "n_predict": 2, "seed": 3,
            "id_slot": 2}
    call(server, "POST", "/completion", body)
    r = call(server, "POST", "/completion", body).json()
    n = r["tokens_evaluated"]
    assert r["timings"]["cache_n"] == n - 1 and r["timings"]["prompt_n"] == 1  # one token re-evaluated
    r = call(server, "POST", "/completion", {**body, "cache_prompt": False}).json()
    assert r["timings"]["cache_n"] == 0 and r["timings"]["prompt_n"] == n


def test_several_prompts_give_an_array(server):
    r = call(server, "POST", "/completion", {"prompt": ["Hi", "Bye"], "n_predict": 2, "seed": 1}).json()
    assert isinstance(r, list) and [x["index"] for x in r] == [0, 1]
    assert [x["prompt"] for x in r] == ["Hi", "Bye"]


def test_n_probs_pre_and_post_sampling(server):
    r = call(server, "POST", "/completion", {"prompt": "The sky is", "n_predict": 3, "seed": 5, "n_probs": 4}).json()
    probs = r["completion_probabilities"]
    assert len(probs) == 3
    for p in probs:
        assert len(p["top_logprobs"]) == 4 and p["logprob"] <= 0
        assert [t["logprob"] for t in p["top_logprobs"]] == sorted((t["logprob"] for t in p["top_logprobs"]),
                                                                    reverse=True)
        assert bytes(p["bytes"]).decode() == p["token"]
    r = call(server, "POST", "/completion", {"prompt": "The sky is", "n_predict": 3, "seed": 5, "n_probs": 10,
                                             "post_sampling_probs": True, "top_k": 3}).json()
    for p in r["completion_probabilities"]:
        assert 0 < p["prob"] <= 1 and 1 <= len(p["top_probs"]) <= 3  # top-k 3, then top-p and min-p cut
        assert sum(t["prob"] for t in p["top_probs"]) == pytest.approx(1.0, abs=1e-5)


def test_truncated_at_the_slot_context(server):
    r = call(server, "POST", "/completion", {"prompt": "1 2 3 4 5 6 7", "n_predict": -1, "ignore_eos": True,
                                             "seed": 1}).json()
    n_prompt = r["tokens_evaluated"]
    assert r["truncated"] is True and r["stop_type"] == "limit"
    assert r["tokens_predicted"] == 256 - n_prompt
    eog = [b["token"] for b in r["generation_settings"]["logit_bias"]]
    assert 2 in eog and all(b["bias"] is None for b in r["generation_settings"]["logit_bias"])


# --- errors ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("body, message", [
    ({"prompt": "x", "repeat_last_n": -2}, "Field 'repeat_last_n': Value must be between 0 <= value <= "),
    ({"prompt": "x", "n_predict": -5}, "Field 'n_predict': Value must be between -1 <= value <= 2147483647"),
    ({"prompt": "x", "top_k": "many"}, "Field 'top_k': "),
    ({"prompt": "x", "grammar": "root ::= ("}, ""),
    ({"prompt": "x", "n": 9}, "Field 'n': Value must be between 1 <= value <= 4, but got 9"),
    ({}, '"prompt" is required'),
])
def test_bad_completion_requests_are_400(server, body, message):
    for stream in (False, True):
        r = call(server, "POST", "/completion", {**body, "stream": stream})
        assert r.status == 400, r.body
        err = r.json()["error"]
        assert err["code"] == 400 and err["type"] == "invalid_request_error" and err["message"].startswith(message)


def test_prompt_longer_than_the_slot_is_400(server):
    prompt = "word " * 300
    for stream in (False, True):
        r = call(server, "POST", "/completion", {"prompt": prompt, "stream": stream})
        assert r.status == 400
        err = r.json()["error"]
        assert err["type"] == "exceed_context_size_error" and err["n_ctx"] == 256 and err["n_prompt_tokens"] > 256
        assert "exceeds the available context size (256 tokens)" in err["message"]


@pytest.mark.parametrize("body, message", [
    ({}, "'messages' is required"),
    ({"messages": "hi"}, "Expected 'messages' to be an array"),
    ({"messages": [{"role": "user"}]}, "All non-assistant messages must contain 'content'"),
    ({"messages": CHAT, "response_format": {"type": "sound"}}, 'response_format type must be one of "text"'),
    ({"messages": CHAT, "top_logprobs": 3}, "top_logprobs requires logprobs"),
    ({"messages": [*CHAT, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]},
     "Cannot have 2 or more assistant messages"),
    ({"messages": CHAT, "add_generation_prompt": True, "continue_final_message": True}, "Cannot set both"),
    ({"messages": CHAT, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 123}}}}, ""),
    ({"messages": CHAT, "chat_template_kwargs": ["enable_thinking"]}, "'chat_template_kwargs' must be an object"),
    ({"messages": CHAT, "chat_template_kwargs": {"enable_thinking": "no"}},
     'invalid type for "enable_thinking" (expected boolean, got str)'),
])
def test_bad_chat_requests_are_400(server, body, message):
    r = call(server, "POST", "/v1/chat/completions", body)
    assert r.status == 400, r.body
    assert r.json()["error"]["message"].startswith(message)


# --- the openai client ----------------------------------------------------------------------------------------


def test_openai_chat_non_stream_and_stream(client):
    kw = {"model": "smol", "messages": CHAT, "max_tokens": 16, "seed": 11, "temperature": 0.8}
    r = client.chat.completions.create(**kw)
    assert re.fullmatch(r"chatcmpl-[0-9A-Za-z]{32}", r.id) and r.system_fingerprint.startswith("b")
    assert r.object == "chat.completion" and r.model == "smol"
    msg = r.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str) and msg.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 16 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert len({c.id for c in chunks}) == 1
    first = chunks[0].choices[0].delta
    assert first.role == "assistant" and first.content is None
    assert all(c.choices[0].delta.role is None for c in chunks[1:] if c.choices)
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].delta.content is None
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == msg.content


def test_openai_chat_ends_with_done(server):
    r = call(server, "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 3, "stream": True})
    events = r.events()
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-2]["choices"][0]["delta"] == {}


def test_openai_completions(client):
    r = client.completions.create(model="smol", prompt="Once upon a time", max_tokens=10, seed=3)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.system_fingerprint.startswith("b") and r.usage.completion_tokens == 10
    chunks = list(client.completions.create(model="smol", prompt="Once upon a time", max_tokens=10, seed=3,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_openai_logprobs(client):
    for stream in (False, True):
        r = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=8, seed=4, logprobs=True,
                                           top_logprobs=3, stream=stream)
        if stream:
            chunks = [c for c in r if c.choices]
            content = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
            text = "".join(c.choices[0].delta.content or "" for c in chunks)
        else:
            content, text = r.choices[0].logprobs.content, r.choices[0].message.content
        assert "".join(e.token for e in content) == text
        assert all(e.logprob <= 0 and len(e.top_logprobs) == 3 for e in content)
        assert all(e.bytes == list(e.token.encode()) for e in content)  # an end token's are empty, as its text


def test_openai_json_schema(client):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    r = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "A person as JSON"}],
                                       max_tokens=60, seed=1, temperature=0,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "p", "schema": schema}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "JSON please"}],
                                       max_tokens=40, seed=1, temperature=0, response_format={"type": "json_object"})
    assert r.choices[0].message.content.startswith("{")  # an object (cut at 40 tokens)


def test_gbnf_grammar(server):
    r = call(server, "POST", "/v1/chat/completions", {"messages": CHAT, "grammar": 'root ::= "a"{5,5}'}).json()
    assert r["choices"][0]["message"]["content"] == "aaaaa" and r["choices"][0]["finish_reason"] == "stop"


def test_assistant_prefill(server):
    a = call(server, "POST", "/apply-template", {"messages": [*CHAT, {"role": "assistant", "content": "Red,"}]})
    b = call(server, "POST", "/apply-template", {"messages": [*CHAT, {"role": "assistant", "content": "Red,"}],
                                                 "continue_final_message": True, "add_generation_prompt": False})
    assert a.json()["prompt"] == b.json()["prompt"]
    assert a.json()["prompt"].endswith("<|im_start|>assistant\nRed,")
    parts = [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]  # a continued message's parts: a blank
    c = call(server, "POST", "/apply-template", {"messages": [*CHAT, {"role": "assistant", "content": parts}]})
    assert c.json()["prompt"].endswith("<|im_start|>assistant\nWh\n\nill")  # line between (render_content)


def test_n_choices(client):
    r = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=6, seed=9, n=2)
    assert [c.index for c in r.choices] == [0, 1]


# --- concurrency: same seed, same text, whatever else runs ------------------------------------------------------


def test_eight_concurrent_streams_give_the_text_they_give_alone(server, client):
    prompts = [f"Write a short line about the number {i}." for i in range(8)]
    kw = {"model": "smol", "max_tokens": 24, "temperature": 0.8}
    alone = [client.chat.completions.create(messages=[{"role": "user", "content": p}], seed=i, **kw)
             .choices[0].message.content for i, p in enumerate(prompts)]
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def stream(i: int) -> None:
        try:
            chunks = client.chat.completions.create(messages=[{"role": "user", "content": prompts[i]}], seed=i,
                                                    stream=True, **kw)
            results[i] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors
    assert [results[i] for i in range(8)] == alone


def test_a_disconnected_stream_frees_its_slot(server):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/completion", body=json.dumps({"prompt": "Count:", "n_predict": -1, "ignore_eos": True,
                                                         "stream": True, "id_slot": 3}),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    r.readline()  # the first event arrived: the slot is generating
    assert call(server, "GET", "/slots").json()[3]["is_processing"] is True
    conn.close()
    deadline = time.time() + 10
    while call(server, "GET", "/slots").json()[3]["is_processing"]:
        assert time.time() < deadline, "the slot is still busy 10 s after the client left"
        time.sleep(0.1)


# --- API key and CORS -----------------------------------------------------------------------------------------


def test_api_key_and_cors(smol):
    import openai

    with live_server(smol, n_slots=1, n_ctx=512, api_keys=("sk-one", "sk-two")) as s:
        assert call(s, "GET", "/health").status == 200
        r = call(s, "GET", "/v1/models")
        assert r.status == 401
        assert r.json() == {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}
        assert call(s, "GET", "/v1/models", headers={"Authorization": "Bearer sk-two"}).status == 200
        assert call(s, "GET", "/v1/models", headers={"Authorization": "sk-one"}).status == 200
        assert call(s, "GET", "/v1/models", headers={"X-Api-Key": "sk-one"}).status == 200
        assert call(s, "GET", "/v1/models", headers={"Authorization": "Bearer nope"}).status == 401
        # by default only loopback pages may call the server (llama-server echoes every Origin)
        r = call(s, "OPTIONS", "/v1/chat/completions", headers={"Origin": "http://example.org"})
        assert r.status == 200 and "access-control-allow-origin" not in r.headers
        assert "access-control-allow-credentials" not in r.headers
        r = call(s, "OPTIONS", "/v1/chat/completions", headers={"Origin": "http://127.0.0.1:5173"})
        assert r.status == 200
        assert r.headers["access-control-allow-origin"] == "http://127.0.0.1:5173"
        assert r.headers["access-control-allow-credentials"] == "true"
        assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
        assert r.headers["access-control-allow-headers"] == "*"
        assert call(s, "GET", "/metrics", headers={"X-Api-Key": "sk-one"}).status == 501
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="sk-one", max_retries=0)
        assert c.chat.completions.create(model="x", messages=CHAT, max_tokens=2).choices[0].message.content
        bad = openai.OpenAI(base_url=s.url + "/v1", api_key="sk-three", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model="x", messages=CHAT, max_tokens=2)


def test_cors_localhost_only(smol):
    with live_server(smol, n_slots=1, n_ctx=256, cors_origins="localhost") as s:
        r = call(s, "GET", "/health", headers={"Origin": "http://localhost:3000"})
        assert r.headers["access-control-allow-origin"] == "http://localhost:3000"
        r = call(s, "GET", "/health", headers={"Origin": "http://localhost.evil.com"})
        assert "access-control-allow-origin" not in r.headers
        r = call(s, "GET", "/health", headers={"Origin": "http://[::1"})  # not a URL: refused, not a 500
        assert r.status == 200 and "access-control-allow-origin" not in r.headers


def test_cors_any_origin_never_with_credentials_and_origin_lists(smol):
    with live_server(smol, n_slots=1, n_ctx=256, cors_origins="*") as s:
        r = call(s, "OPTIONS", "/v1/models", headers={"Origin": "http://example.org"})
        assert r.headers["access-control-allow-origin"] == "*"
        assert r.headers["access-control-allow-credentials"] == "false"
    with live_server(smol, n_slots=1, n_ctx=256, cors_origins="https://a.example, https://b.example") as s:
        r = call(s, "OPTIONS", "/v1/models", headers={"Origin": "https://b.example"})
        assert r.headers["access-control-allow-origin"] == "https://b.example"
        assert r.headers["access-control-allow-credentials"] == "true" and r.headers["vary"] == "Origin"
        r = call(s, "OPTIONS", "/v1/models", headers={"Origin": "https://c.example"})
        assert "access-control-allow-origin" not in r.headers


def test_prompt_progress(server):
    prompt = "This is a test. " * 10
    events = call(server, "POST", "/completion", {"prompt": prompt, "n_predict": 2, "stream": True,
                                                  "return_progress": True, "cache_prompt": False}).events()
    progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    total = progress[0]["total"]
    assert [p["processed"] for p in progress] == [0, total] and {p["cache"] for p in progress} == {0}
    chunks = call(server, "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "stream": True,
                                                           "return_progress": True}).events()
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None} and "prompt_progress" in chunks[0]
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:-1] if c["choices"])


def test_n_indent_stops_at_a_dedented_line(server):
    body = {"prompt": "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n", "n_predict": 64, "temperature": 0}
    free = call(server, "POST", "/completion", body).json()["content"]
    r = call(server, "POST", "/completion", {**body, "n_indent": 4}).json()
    # greedy: a line "```", an empty line, ...; the empty line is indented 0 < 4 (llama.cpp counts it), so the
    # text is cut where it starts
    assert free.startswith("```\n\n") and r["stop_type"] == "limit" and r["content"] == "```\n"


def test_logit_bias_forms_and_out_of_vocabulary_ids(server):
    base = {"prompt": "1, 2, 3, 4,", "n_predict": 4, "temperature": 0}
    free = call(server, "POST", "/completion", base).json()["content"]
    assert free.startswith(" 5")
    for bias in ([[" 5", False]], {" 5,": False}, [[call(server, "POST", "/tokenize", {"content": " 5"}).json()
                                                     ["tokens"][0], -1e9]]):
        r = call(server, "POST", "/completion", {**base, "logit_bias": bias}).json()
        assert not r["content"].startswith(" 5"), bias
    r = call(server, "POST", "/completion", {**base, "logit_bias": [[49152, 1.0]]})
    assert r.status == 400 and "49152" in r.json()["error"]["message"]  # llama-server skips it silently


def test_speculative_slots_give_the_same_text(smol):
    from benchmarks.bench_speculative import TASKS

    from samplechain.speculative.config import SpeculationConfig

    prompt = TASKS["copy"]
    bodies = [{"prompt": prompt, "n_predict": 40, "temperature": 0},
              {"prompt": prompt, "n_predict": 40, "seed": 3, "temperature": 0.8, "repeat_penalty": 1.1,
               "stop": ["waves"]}]
    with live_server(smol, n_slots=2, n_ctx=1024) as plain:
        expected = [call(plain, "POST", "/completion", b).json() for b in bodies]
    with live_server(smol, n_slots=2, n_ctx=1024, metrics=True,
                     speculation=SpeculationConfig(("ngram-simple",), n_max=8, adaptive=False, ngram={
                         "ngram_simple_size_n": 3, "ngram_simple_size_m": 16})) as spec:
        got = [call(spec, "POST", "/completion", b).json() for b in bodies]
        streamed = call(spec, "POST", "/completion", {**bodies[0], "stream": True}).events()
        metrics = call(spec, "GET", "/metrics").body.decode()
    for e, g in zip(expected, got, strict=True):
        assert g["content"] == e["content"] and g["stop_type"] == e["stop_type"]
        assert g["tokens_predicted"] == e["tokens_predicted"]
    assert "".join(ev["content"] for ev in streamed) == expected[0]["content"]
    assert got[0]["timings"]["draft_n_accepted"] > 0  # the copy was drafted
    assert re.search(r"^llamacpp:spec_decode_num_accepted_tokens_total [1-9]", metrics, re.M)


@pytest.mark.parametrize("argv", [["-np", "0"], ["-b", "0"], ["-n", "-3"], ["--spec-type", "draft-simple"],
                                  ["--port", "-1"], ["--temp", "nan"]])
def test_serve_usage_errors(argv, capsys):
    from samplechain.cli import main

    with pytest.raises(SystemExit) as e:
        main(["serve", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert re.match(r"samplechain( serve)?: error: ", err) and err.count("\n") == 1


def test_serve_bad_drafter_name(capsys):
    from samplechain.cli import main

    assert main(["serve", "--spec-type", "ngram-nothing"]) == 1
    assert "ngram-nothing" in capsys.readouterr().err


def test_503_while_the_model_loads():
    import uvicorn

    from samplechain.server.app import Gate, ServerConfig, ServerState, create_app

    state = ServerState(ServerConfig())  # never loaded
    server = uvicorn.Server(uvicorn.Config(Gate(create_app(state), state), host="127.0.0.1", port=0,
                                           log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.01)

        class Where:
            port = server.servers[0].sockets[0].getsockname()[1]

        for path in ("/health", "/v1/models"):
            r = call(Where, "GET", path)
            assert r.status == 503
            assert r.json() == {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
        assert call(Where, "OPTIONS", "/v1/models").status == 200  # preflight needs no model
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_backend_sampling_gives_the_same_text(server):
    bodies = [{"prompt": f"Tell me about {w}.", "n_predict": 16, "seed": i, "n_probs": 2, "post_sampling_probs": True}
              for i, w in enumerate(["rivers", "stars", "bread"])]
    plain = [call(server, "POST", "/completion", b).json() for b in bodies]
    results: dict[int, dict] = {}

    def run(i: int) -> None:
        results[i] = call(server, "POST", "/completion", {**bodies[i], "backend_sampling": True}).json()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]  # batched together on the device path
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for i, p in enumerate(plain):
        assert results[i]["content"] == p["content"]
        assert results[i]["completion_probabilities"] == p["completion_probabilities"]


def test_serve_a_missing_model_or_device_is_one_line(capsys, tmp_path):
    from samplechain.cli import main

    assert main(["serve", "-m", str(tmp_path / "nope.gguf")]) == 1
    assert capsys.readouterr().err.startswith("samplechain serve: error: no model file")
    assert main(["serve", "--device", "tpu"]) == 1
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all")
    assert main(["serve", "-m", str(bad), "--port", "0"]) == 1  # the listener stops when the model fails to load
    assert "not a GGUF file" in capsys.readouterr().err


def test_thinking_budget_and_reasoning_content(server):
    messages = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "<think>"}]
    base = {"messages": messages, "max_tokens": 24, "temperature": 0}
    closed = call(server, "POST", "/v1/chat/completions", {**base, "thinking_budget_tokens": 0}).json()
    msg = closed["choices"][0]["message"]
    assert "reasoning_content" not in msg and "</think>" not in msg["content"]  # the block was closed at once
    brief = call(server, "POST", "/v1/chat/completions", {**base, "reasoning_budget_tokens": 3}).json()
    msg = brief["choices"][0]["message"]
    thought = msg["reasoning_content"]
    assert len(call(server, "POST", "/tokenize", {"content": thought}).json()["tokens"]) <= 3
    assert "</think>" not in msg["content"]
    raw = call(server, "POST", "/v1/chat/completions", {**base, "thinking_budget_tokens": 3,
                                                        "reasoning_format": "none"}).json()
    assert raw["choices"][0]["message"]["content"].startswith(thought + "</think>")


def test_chat_template_kwargs_reach_the_template(server):
    """llama-server's chat_template_kwargs: extra template variables (the template may read them), enable_thinking."""
    body = {"messages": CHAT, "max_tokens": 2, "chat_template_kwargs": {"enable_thinking": False, "custom": 1}}
    r = call(server, "POST", "/v1/chat/completions", body)
    assert r.status == 200, r.body
    assert r.json()["usage"]["completion_tokens"] == 2
