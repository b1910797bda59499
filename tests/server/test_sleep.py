"""Sleeping when idle (``sleep_idle_seconds``, llama-server's ``--sleep-idle-seconds``; server/sleep.py): the model
is released after the idle time and loaded again, transparently, by the next request that needs it; read-only
routes answer without waking it (after llama.cpp's tools/server/tests/unit/test_sleep.py)."""

import gc
import threading
import time
import weakref

import pytest
from tests.server.conftest import call, live_server

from samplechain.server.app import BackgroundServer, ServerConfig
from samplechain.server.sleep import SLEEPING

HELLO = [{"role": "user", "content": "Hello world"}]


def sleepy_server(**config) -> BackgroundServer:
    """A server that sleeps after 1 s idle, loading SmolLM2 by its name (each load a new Model over the session's
    weights: see tests/conftest.py)."""
    return BackgroundServer(ServerConfig(port=0, model="smollm2", sleep_idle_seconds=1, **config))


SEEDED = {"prompt": "The capital of France is", "n_predict": 12, "temperature": 0.8, "seed": 42}


@pytest.fixture(scope="module")
def sleepy():
    with sleepy_server(n_slots=2, n_ctx=512, metrics=True, alias=("smol",)) as s:
        yield s


def sleeping(server) -> bool:
    r = call(server, "GET", "/props")
    assert r.status == 200
    return r.json()["is_sleeping"]


def wait_asleep(server, timeout: float = 10.0, props: bool = True) -> None:
    """Until the model is released (``/props`` says so from the moment the engine decides to sleep)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (not props or sleeping(server)) and server.state.sleeper.phase == SLEEPING:
            return
        time.sleep(0.05)
    raise AssertionError("the server did not go to sleep")


def metric(text: str, name: str) -> float:
    [line] = [ln for ln in text.splitlines() if ln.startswith(f"llamacpp:{name} ")]
    return float(line.split()[1])


def scrape(server) -> str:
    r = call(server, "GET", "/metrics")
    assert r.status == 200
    return r.body.decode()


def test_sleep_idle_seconds_is_validated():
    for bad in (0, -2, -0.5):
        with pytest.raises(ValueError, match="cannot be 0 or less than -1"):
            ServerConfig(sleep_idle_seconds=bad)
    assert ServerConfig(sleep_idle_seconds=-1).sleep_idle_seconds == -1
    assert ServerConfig(sleep_idle_seconds=0.5).sleep_idle_seconds == 0.5


def test_without_sleep_nothing_changes(server):
    assert server.state.sleeper is None and server.state.engine.idle_timer is None
    assert call(server, "GET", "/props").json()["is_sleeping"] is False
    assert metric(scrape(server), "n_sleeps_total") == 0


def test_read_only_routes_answer_from_the_snapshots_without_waking(sleepy):
    call(sleepy, "POST", "/tokenize", {"content": "wake"})  # awake
    props = call(sleepy, "GET", "/props").json()
    models = call(sleepy, "GET", "/v1/models").json()
    assert props["is_sleeping"] is False
    wait_asleep(sleepy)
    loads = sleepy.state.sleeper.n_loads
    assert call(sleepy, "GET", "/health").json() == {"status": "ok"}
    assert call(sleepy, "GET", "/props").json() == {**props, "is_sleeping": True}
    created = models["data"][0].pop("created")
    for path in ("/models", "/v1/models"):
        asleep = call(sleepy, "GET", path).json()
        assert asleep["data"][0].pop("created") >= created  # when it went to sleep
        assert asleep == models and asleep["data"][0]["id"] == "smol"
    scrape(sleepy)
    assert call(sleepy, "GET", "/nowhere").status == 404  # a path no route answers does not wake it
    assert call(sleepy, "GET", "/v1/responses/resp_none").status == 404  # nor the responses store
    assert sleeping(sleepy) and sleepy.state.model is None and sleepy.state.engine is None
    assert sleepy.state.sleeper.n_loads == loads


def test_a_completion_wakes_it_with_the_same_text_as_before_sleeping(sleepy):
    before = call(sleepy, "POST", "/completion", SEEDED).json()
    wait_asleep(sleepy)
    loads = sleepy.state.sleeper.n_loads
    after = call(sleepy, "POST", "/completion", SEEDED)
    assert after.status == 200
    assert after.json()["content"] == before["content"] and after.json()["tokens_predicted"] == 12
    assert after.json()["timings"]["cache_n"] == 0  # the slots' caches went with the model
    assert sleeping(sleepy) is False and sleepy.state.sleeper.n_loads == loads + 1
    again = call(sleepy, "POST", "/completion", SEEDED).json()  # awake, the slot's cache is reused
    assert again["content"] == before["content"] and again["timings"]["cache_n"] == 4


def test_concurrent_requests_during_sleep_share_one_reload(sleepy):
    wait_asleep(sleepy)
    loads = sleepy.state.sleeper.n_loads
    replies: list = [None] * 4
    bodies = [SEEDED, {"content": "Hello"}, {"messages": HELLO}, SEEDED]
    paths = ["/completion", "/tokenize", "/chat/completions/input_tokens", "/completion"]

    def one(i: int) -> None:
        replies[i] = call(sleepy, "POST", paths[i], bodies[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [r.status for r in replies] == [200] * 4
    assert replies[0].json()["content"] == replies[3].json()["content"]
    assert replies[1].json() == {"tokens": [19556]}
    assert sleepy.state.sleeper.n_loads == loads + 1


def test_metrics_during_sleep_are_the_last_scrape_awake_and_count_the_sleeps(sleepy):
    assert call(sleepy, "POST", "/completion", {**SEEDED, "n_predict": 4}).status == 200
    scrape(sleepy)  # the first scrape empties the throughput window
    awake = scrape(sleepy)
    assert metric(awake, "predicted_tokens_seconds") == 0
    wait_asleep(sleepy)
    assert scrape(sleepy) == awake  # the sleep not counted yet: the snapshot was taken before
    assert sleeping(sleepy)
    assert call(sleepy, "POST", "/tokenize", {"content": "Hello"}).status == 200  # wakes it
    woke = scrape(sleepy)
    assert metric(woke, "n_sleeps_total") == metric(awake, "n_sleeps_total") + 1
    assert metric(woke, "tokens_predicted_total") == metric(awake, "tokens_predicted_total")


def test_the_throughput_window_is_reported_once_across_a_sleep(sleepy):
    assert call(sleepy, "POST", "/completion", {**SEEDED, "n_predict": 8}).status == 200
    wait_asleep(sleepy)
    assert metric(scrape(sleepy), "predicted_tokens_seconds") > 0  # the last generation's, from the snapshot
    assert metric(scrape(sleepy), "predicted_tokens_seconds") == 0
    assert sleeping(sleepy)
    assert call(sleepy, "POST", "/tokenize", {"content": "Hello"}).status == 200
    assert sleeping(sleepy) is False
    assert metric(scrape(sleepy), "predicted_tokens_seconds") == 0  # not reported again after waking


def test_sleeping_releases_the_model_engine_and_cache(sleepy):
    assert call(sleepy, "POST", "/tokenize", {"content": "Hello"}).status == 200
    # the visualizer's trace context goes with the engine (it held the first model for good)
    assert call(sleepy, "POST", "/sampling/trace", {"prompt": "Hello", "n_top": 2}).status == 200
    model, engine = weakref.ref(sleepy.state.model), weakref.ref(sleepy.state.engine)
    ctx = weakref.ref(sleepy.state.engine.ctx)
    wait_asleep(sleepy)
    gc.collect()
    assert model() is None and engine() is None and ctx() is None


@pytest.mark.parametrize(("path", "body"), [
    ("/chat/completions/input_tokens", {"messages": HELLO}),
    ("/v1/responses/input_tokens", {"input": "Hello world"}),
    ("/v1/messages/count_tokens", {"messages": HELLO}),
    ("/slots", None),  # llama-server's /slots asks the engine: it wakes it
])
def test_routes_that_need_the_model_wake_it(sleepy, path, body):
    wait_asleep(sleepy)
    r = call(sleepy, "GET" if body is None else "POST", path, body)
    assert r.status == 200
    if body is not None:
        assert r.json()["input_tokens"] == 32  # SmolLM2's default system prompt, the user turn, the assistant's header
    else:
        assert [s["id"] for s in r.json()] == [0, 1]
    assert sleeping(sleepy) is False


def test_input_tokens_agree_across_the_three_apis(sleepy):
    counts = [call(sleepy, "POST", path, body).json() for path, body in (
        ("/v1/chat/completions/input_tokens", {"messages": HELLO}),
        ("/responses/input_tokens", {"input": [{"role": "user", "content": "Hello world"}]}),
        ("/messages/count_tokens", {"messages": HELLO}))]
    assert counts == [{"input_tokens": 32, "object": "response.input_tokens"},
                      {"input_tokens": 32, "object": "response.input_tokens"}, {"input_tokens": 32}]
    prompt = call(sleepy, "POST", "/apply-template", {"messages": HELLO}).json()["prompt"]
    assert len(call(sleepy, "POST", "/tokenize", {"content": prompt}).json()["tokens"]) == 32


def test_a_stream_longer_than_the_idle_time_is_not_cut(sleepy):
    assert call(sleepy, "POST", "/tokenize", {"content": "Hello"}).status == 200
    loads = sleepy.state.sleeper.n_loads
    sleepy.state.engine.step_hook = lambda: time.sleep(0.15)
    try:
        r = call(sleepy, "POST", "/completion", {**SEEDED, "n_predict": 16, "stream": True})  # ~2.5 s
    finally:
        sleepy.state.engine.step_hook = None
    events = r.events()
    assert r.status == 200 and events[-1]["stop"] is True and events[-1]["tokens_predicted"] == 16
    assert len([e for e in events if not e["stop"]]) == 16
    assert sleeping(sleepy) is False and sleepy.state.sleeper.n_loads == loads


def test_a_failed_reload_is_a_503_and_the_next_request_retries(sleepy, monkeypatch):
    import samplechain.runtime

    real = samplechain.runtime.load_model

    def broken(*args, **kwargs):
        raise OSError("the disk is gone")

    wait_asleep(sleepy)
    monkeypatch.setattr(samplechain.runtime, "load_model", broken)
    r = call(sleepy, "POST", "/tokenize", {"content": "Hello"})
    assert r.status == 503
    assert r.json()["error"] == {"code": 503, "message": "Model failed to load: OSError: the disk is gone",
                                 "type": "unavailable_error"}
    assert sleeping(sleepy) and sleepy.state.sleeper.phase == SLEEPING
    monkeypatch.setattr(samplechain.runtime, "load_model", real)
    assert call(sleepy, "POST", "/tokenize", {"content": "Hello"}).json() == {"tokens": [19556]}
    assert sleeping(sleepy) is False


def test_a_sleeping_server_shuts_down_at_once_and_unauthorized_requests_do_not_wake_it():
    with sleepy_server(n_slots=1, n_ctx=256, api_keys=("k",)) as s:
        wait_asleep(s, props=False)
        assert call(s, "POST", "/tokenize", {"content": "Hello"}).status == 401
        assert call(s, "GET", "/props", headers={"Authorization": "Bearer k"}).json()["is_sleeping"] is True
        assert s.state.sleeper.phase == SLEEPING and s.state.sleeper.n_loads == 1
        t0 = time.time()
        s.shutdown(timeout=10)
        assert time.time() - t0 < 3
        assert not s.thread.is_alive() and not s.state._thread.is_alive()


def test_a_model_given_to_the_server_stays_the_callers_and_its_engine_is_released(smol):
    with live_server(smol, sleep_idle_seconds=1, n_slots=1, n_ctx=256) as s:
        before = call(s, "POST", "/completion", SEEDED).json()["content"]
        engine = weakref.ref(s.state.engine)
        wait_asleep(s)
        gc.collect()
        assert engine() is None and s.state.model is None
        assert call(s, "POST", "/completion", SEEDED).json()["content"] == before
        assert s.state.model is smol and s.state.sleeper.n_loads == 2


def test_shutting_down_while_it_wakes_answers_the_waiters_503_and_ends_the_engine_thread(monkeypatch):
    import samplechain.runtime

    real = samplechain.runtime.load_model
    loading = threading.Event()

    def slow(*args, **kwargs):
        loading.set()
        time.sleep(1.0)
        return real(*args, **kwargs)

    with sleepy_server(n_slots=1, n_ctx=256) as s:
        wait_asleep(s)
        monkeypatch.setattr(samplechain.runtime, "load_model", slow)
        replies = []
        waiter = threading.Thread(target=lambda: replies.append(call(s, "POST", "/tokenize", {"content": "Hi"})))
        waiter.start()
        assert loading.wait(10)
        s.shutdown(timeout=10)
        waiter.join(10)
        assert [r.status for r in replies] == [503]
        assert replies[0].json()["error"]["message"] == "the server is shutting down"
        s.state._thread.join(5)
        assert not s.state._thread.is_alive() and s.state.engine is None and s.state.model is None
