"""Router mode: several models behind one server, each in a ``serve`` child of its own (``server.router``).

The models are the tiny fixture GGUFs of three families (each loads in a fraction of a second; their text is
random-weight text, the same for a seed whatever else runs). Tests that need a model busy or loading use the
router's delay hook (llama-server's ``LLAMA_SERVER_DEBUG_FAKE_TIMING``), shortened."""

from __future__ import annotations

import os
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2 as httpx
import pytest

from samplechain.server.config import ServerConfig
from samplechain.server.router import RouterConfig
from samplechain.server.router_app import BackgroundRouter
from samplechain.server.router_models import load_specs, read_preset

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "models"
CHILD = ("-np", "4", "-c", "1024", "-t", "1", "--log-level", "error")
NAMES = ("llama3", "qwen2", "gemma3")


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "models"
    folder.mkdir()
    for name in NAMES:
        shutil.copy(FIXTURES / f"{name}-Q8_0.gguf", folder / f"{name}.gguf")
    return folder


def router(folder: Path, **kwargs) -> BackgroundRouter:
    server = kwargs.pop("server", ServerConfig(port=0))
    return BackgroundRouter(RouterConfig(server=server, models_dir=str(folder), cache=False, child_args=CHILD,
                                         **kwargs))


def complete(url: str, model: str, i: int = 0, stream: bool = False, headers: dict | None = None,
             timeout: float = 120, params: dict | None = None) -> httpx.Response:
    body = {"model": model, "prompt": f"number {i}", "n_predict": 6, "temperature": 0.8, "seed": 100 + i,
            "stream": stream}
    return httpx.post(url + "/completion", json=body, headers=headers or {}, timeout=timeout, params=params)


def text_of(r: httpx.Response) -> str:
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        import json

        return "".join(json.loads(line[6:])["content"] for line in r.text.splitlines() if line.startswith("data: "))
    return r.json()["content"]


def status(url: str, name: str) -> str:
    return next(m["status"]["value"] for m in httpx.get(url + "/models").json()["data"] if m["id"] == name)


def wait_status(url: str, name: str, wanted: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while status(url, name) != wanted:
        assert time.monotonic() < deadline, f"{name} never became {wanted}"
        time.sleep(0.05)


def load(url: str, name: str) -> None:
    r = httpx.post(url + "/models/load", json={"model": name})
    assert r.status_code == 200 and r.json() == {"success": True}
    wait_status(url, name, "loaded")


# --- the model list ----------------------------------------------------------------------------------------------


def test_models_dir_lists_files_and_folders(tmp_path: Path, models_dir: Path):
    shard = models_dir / "big"
    shard.mkdir()
    (shard / "big-00002-of-00002.gguf").write_bytes(b"")
    (shard / "big-00001-of-00002.gguf").write_bytes(b"")
    (shard / "mmproj-big.gguf").write_bytes(b"")
    (models_dir / "mmproj-x.gguf").write_bytes(b"")
    (models_dir / "notes.txt").write_text("")
    specs = load_specs(str(models_dir), None, None)
    assert sorted(specs) == ["big", "gemma3", "llama3", "qwen2"]
    assert specs["big"].path == str(shard / "big-00001-of-00002.gguf")
    assert specs["llama3"].options == {"model": str(models_dir / "llama3.gguf")}
    with pytest.raises(ValueError, match="does not exist or is not a directory"):
        load_specs(str(tmp_path / "nowhere"), None, None)


def test_presets_cascade_and_name_new_models(tmp_path: Path, models_dir: Path):
    ini = tmp_path / "presets.ini"
    ini.write_text("version = 1\n; a comment\n[*]\nc = 2048\nLLAMA_ARG_N_PREDICT = 5\n\n"
                   "[llama3]\nc = 512\ntemp = 0\n\n[user/repo:q4_k_m]\nhf-repo = user/repo:q4_k_m\n"
                   "load-on-startup = true\nstop-timeout = 3\n\n[mine]\nmodel = /x/y.gguf\n")
    common, sections = read_preset(str(ini))
    assert common == {"c": "2048", "n-predict": "5"}
    assert sorted(sections) == ["llama3", "mine", "user/repo:Q4_K_M"]
    specs = load_specs(str(models_dir), str(ini), None)
    assert specs["llama3"].options == {"c": "512", "n-predict": "5", "model": str(models_dir / "llama3.gguf"),
                                       "temp": "0"}
    assert specs["qwen2"].options == {"c": "2048", "n-predict": "5", "model": str(models_dir / "qwen2.gguf")}
    repo = specs["user/repo:Q4_K_M"]
    assert (repo.source, repo.load_on_startup, repo.stop_timeout) == ("preset", True, 3.0)
    assert specs["mine"].path == "/x/y.gguf"
    ini.write_text("[ghost]\nc = 1\n")
    with pytest.raises(ValueError, match=r"\[ghost\] is no known model and names none"):
        load_specs(str(models_dir), str(ini), None)


# --- routing and loading ------------------------------------------------------------------------------------------


def test_a_request_loads_its_model_and_the_router_answers_for_itself(models_dir: Path):
    with router(models_dir, models_max=2) as r:
        props = httpx.get(r.url + "/props").json()
        assert (props["role"], props["max_instances"], props["models_autoload"]) == ("router", 2, True)
        assert httpx.get(r.url + "/health").json() == {"status": "ok"}
        assert {m["id"]: m["status"]["value"] for m in httpx.get(r.url + "/v1/models").json()["data"]} == {
            "gemma3": "unloaded", "llama3": "unloaded", "qwen2": "unloaded"}
        a = complete(r.url, "llama3")
        assert a.status_code == 200 and a.json()["model"] == "llama3"
        assert status(r.url, "llama3") == "loaded" and r.models.table["llama3"].loads == 1
        # GET routes name their model in the query; the child's own props come back
        assert httpx.get(r.url + "/props", params={"model": "llama3"}).json()["model_alias"] == "llama3"
        for body, message in (({"prompt": "x"}, "model name is missing from the request"),
                              ({"model": "nope", "prompt": "x"}, "model 'nope' not found")):
            e = httpx.post(r.url + "/completion", json=body)
            assert (e.status_code, e.json()["error"]["message"]) == (400, message)
        e = httpx.post(r.url + "/v1/messages", json={"model": "nope", "max_tokens": 1, "messages": []})
        assert e.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                       "message": "model 'nope' not found"}}
        # the same seed gives the same text through the router as twice in a row
        assert text_of(complete(r.url, "llama3", stream=True)) == text_of(a)


def test_without_autoload_a_model_must_be_loaded_first(models_dir: Path):
    with router(models_dir, autoload=False) as r:
        e = complete(r.url, "qwen2")
        assert (e.status_code, e.json()["error"]["message"]) == (400, "model is not loaded")
        assert complete(r.url, "qwen2", params={"autoload": "true"}).status_code == 200  # a request may ask for it
        assert httpx.post(r.url + "/models/unload", json={"model": "qwen2"}).json() == {"success": True}
        wait_status(r.url, "qwen2", "unloaded")
        load(r.url, "qwen2")
        assert httpx.post(r.url + "/models/load", json={"model": "qwen2"}).json()["error"]["message"] == \
            "model is already running"
        assert complete(r.url, "qwen2").status_code == 200


def test_the_least_recently_used_idle_model_makes_room(models_dir: Path):
    with router(models_dir, models_max=2) as r:
        load(r.url, "llama3")
        load(r.url, "qwen2")
        complete(r.url, "llama3")  # qwen2 is now the least recently used
        load(r.url, "gemma3")
        assert {n: status(r.url, n) for n in NAMES} == {"llama3": "loaded", "qwen2": "unloaded",
                                                      "gemma3": "loaded"}
        assert r.models.table["qwen2"].stops == 1 and not r.models.table["qwen2"].failed


def test_a_busy_model_is_never_evicted_and_the_queue_waits(models_dir: Path):
    with router(models_dir, models_max=1, delay=1.0) as r:
        load(r.url, "llama3")
        busy = ThreadPoolExecutor(2)
        first = busy.submit(complete, r.url, "llama3")  # relayed after the delay: busy meanwhile
        time.sleep(0.3)
        queued = busy.submit(complete, r.url, "qwen2")
        assert first.result().status_code == 200 and queued.result().status_code == 200
        assert (status(r.url, "llama3"), status(r.url, "qwen2")) == ("unloaded", "loaded")
        assert r.models.table["llama3"].stops == 1


def test_requests_for_one_model_share_one_load_and_the_queue_is_fifo(models_dir: Path):
    with router(models_dir, models_max=1, delay=0.5) as r:
        load(r.url, "llama3")
        pool = ThreadPoolExecutor(8)
        busy = pool.submit(complete, r.url, "llama3")
        time.sleep(0.2)
        done: dict[str, float] = {}

        def timed(name: str, i: int) -> int:
            code = complete(r.url, name, i).status_code
            done[f"{name}{i}"] = time.monotonic()
            return code

        qwen = [pool.submit(timed, "qwen2", i) for i in range(3)]
        time.sleep(0.5)
        gemma = pool.submit(timed, "gemma3", 0)
        assert busy.result().status_code == 200
        assert [f.result() for f in qwen] == [200, 200, 200] and gemma.result() == 200
        assert r.models.table["qwen2"].loads == 1  # three requests, one load
        assert max(done[f"qwen2{i}"] for i in range(3)) < done["gemma30"]


def test_a_client_that_leaves_the_queue_costs_no_model(models_dir: Path):
    with router(models_dir, models_max=1, delay=1.0) as r:
        load(r.url, "llama3")
        busy = ThreadPoolExecutor(1).submit(complete, r.url, "llama3")
        time.sleep(0.3)
        with pytest.raises(httpx.TimeoutException):
            complete(r.url, "qwen2", timeout=0.5)
        assert busy.result().status_code == 200
        time.sleep(1.5)
        assert (status(r.url, "llama3"), status(r.url, "qwen2")) == ("loaded", "unloaded")
        assert r.models.table["qwen2"].loads == 0


# --- failures and keys ---------------------------------------------------------------------------------------------


def test_a_child_that_dies_is_reported_and_started_again(models_dir: Path):
    with BackgroundRouter(RouterConfig(server=ServerConfig(port=0), models_dir=str(models_dir), cache=False,
                                       child_args=(*CHILD, "--context-shift"))) as r:
        assert complete(r.url, "llama3").status_code == 200
        inst = r.models.table["llama3"]
        body = {"model": "llama3", "prompt": "go", "n_predict": 10**6, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", r.url + "/completion", json=body, timeout=60) as s:
            lines = s.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            os.kill(inst.process.pid, signal.SIGKILL)  # mid-stream (it generates until killed)
            rest = [line for line in lines if line.startswith("data: ")]
        assert '"content"' in first and s.status_code == 200
        assert rest[-1] == ('data: {"error":{"code":502,"message":"the instance of model \'llama3\' stopped before '
                            'it answered","type":"server_error"}}')
        wait_status(r.url, "llama3", "unloaded")
        entry = next(m for m in httpx.get(r.url + "/models").json()["data"] if m["id"] == "llama3")
        assert (entry["status"]["failed"], entry["status"]["exit_code"]) == (True, -9)
        assert complete(r.url, "llama3").status_code == 200 and inst.loads == 2


def test_a_model_that_cannot_load_is_a_clean_error(models_dir: Path):
    (models_dir / "broken.gguf").write_bytes(b"not a gguf")
    with router(models_dir) as r:
        e = complete(r.url, "broken")
        assert e.status_code == 503 and e.json()["error"]["message"].startswith(
            "model 'broken' failed to load (exit status 1)")
        entry = next(m for m in httpx.get(r.url + "/models").json()["data"] if m["id"] == "broken")
        assert entry["status"]["failed"] is True and entry["status"]["value"] == "unloaded"


def test_the_api_key_holds_on_every_route_and_the_children_take_only_the_router(models_dir: Path):
    with router(models_dir, server=ServerConfig(port=0, api_keys=("sk-router",))) as r:
        key = {"Authorization": "Bearer sk-router"}
        for method, path, body in (("POST", "/completion", {"model": "llama3", "prompt": "x"}),
                                   ("GET", "/models", None), ("POST", "/models/load", {"model": "llama3"}),
                                   ("GET", "/props", None), ("GET", "/models/sse", None)):
            e = httpx.request(method, r.url + path, json=body)
            assert (e.status_code, e.json()["error"]["type"]) == (401, "authentication_error")
        assert httpx.get(r.url + "/health").status_code == 200
        assert complete(r.url, "llama3", headers=key).status_code == 200
        child = r.models.table["llama3"].url
        assert httpx.post(child + "/completion", json={"prompt": "x"}, headers=key).status_code == 401


# --- load ----------------------------------------------------------------------------------------------------------


def test_24_concurrent_requests_over_3_models_with_room_for_2(models_dir: Path):
    """Every request answered with its model's own text (the same as alone); each model loaded once, one of the
    first two stopped for the third; two children left."""
    with router(models_dir, models_max=2) as r:
        jobs = [(NAMES[i % 3], i, i % 2 == 0) for i in range(24)]
        with ThreadPoolExecutor(24) as pool:
            got = list(pool.map(lambda j: complete(r.url, j[0], j[1], stream=j[2]), jobs))
        assert [g.status_code for g in got] == [200] * 24
        assert [r.models.table[n].loads for n in NAMES] == [1, 1, 1]
        assert sorted(r.models.table[n].stops for n in NAMES) == [0, 0, 1]
        alive = [n for n in NAMES if r.models.table[n].process is not None]
        assert len(alive) == 2
        for (name, i, stream), g in zip(jobs, got, strict=True):
            if name in alive:
                assert text_of(g) == text_of(complete(r.url, name, i, stream=stream)), (name, i)
        for (name, i, stream), g in zip(jobs, got, strict=True):  # the evicted model's texts, loaded again alone
            if name not in alive:
                assert text_of(g) == text_of(complete(r.url, name, i, stream=stream)), (name, i)


def test_a_model_that_does_not_load_in_time_is_a_clean_error_not_a_hang(models_dir: Path):
    """A child that never answers its health check is stopped after ``load_timeout``; the request waiting for it
    gets a 503 (it used to wait for ever: its queue entry still said "loading")."""
    import sys

    config = RouterConfig(server=ServerConfig(port=0), models_dir=str(models_dir), cache=False, load_timeout=1.0,
                          command=(sys.executable, "-c", "import time; time.sleep(60)"))
    with BackgroundRouter(config) as r:
        e = complete(r.url, "llama3", timeout=120)  # a hang would be the client's timeout
        assert e.status_code == 503
        assert e.json()["error"]["message"] == ("model 'llama3' failed to load (exit status -9): the model did not "
                                                "load in 1 s")
        assert list(r.models.queue) == []


def test_a_client_that_leaves_a_non_streaming_request_frees_its_model(models_dir: Path):
    with BackgroundRouter(RouterConfig(server=ServerConfig(port=0), models_dir=str(models_dir), cache=False,
                                       child_args=(*CHILD, "--context-shift"))) as r:
        load(r.url, "llama3")
        body = {"model": "llama3", "prompt": "go", "n_predict": 10**6, "ignore_eos": True}
        with pytest.raises(httpx.TimeoutException):
            httpx.post(r.url + "/completion", json=body, timeout=1.0)
        inst = r.models.table["llama3"]
        deadline = time.monotonic() + 5
        while inst.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        assert inst.requests == 0  # counted off: the model may make room again
        slots = httpx.get(r.url + "/slots", params={"model": "llama3"}, timeout=10).json()
        deadline = time.monotonic() + 5
        while any(s["is_processing"] for s in slots) and time.monotonic() < deadline:
            time.sleep(0.1)
            slots = httpx.get(r.url + "/slots", params={"model": "llama3"}, timeout=10).json()
        assert not any(s["is_processing"] for s in slots)  # the child stopped generating for nobody
