"""Router mode from the command line (``cli/serve.py``): what the router hands its children (``child_args``,
``preset_flags``), the keys a remote preset may use, ``samplechain serve --models-dir`` and ``-hf PRESET-REPO`` as
processes of their own (sleep, wake, SIGTERM), and the hub cache through the router (``POST /models`` downloads with
their ``/models/sse`` events, ``DELETE /models``, ``dedup-cache-models``) against the stand-in hub on 127.0.0.1
(tests/local_hub.py). ``test_router.py`` has the scheduler."""

from __future__ import annotations

import contextlib
import http.client
import json
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx2 as httpx
import pytest

from local_hub import LocalHub
from samplechain.cli import build_parser, main
from samplechain.cli.common import command_parser
from samplechain.cli.serve import ROUTER_FLAGS, child_args, preset_flags, remote_preset_keys
from samplechain.runtime import hub as hf
from samplechain.runtime.hub import download_model
from samplechain.server.config import ServerConfig
from samplechain.server.router import Models, RouterConfig
from samplechain.server.router_app import BackgroundRouter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "models"
TINY = "test-org/tiny-GGUF"
TINY_Q8 = f"{TINY}:Q8_0"
CHILD = ("-np", "2", "-c", "512", "-t", "1")
LISTENING = re.compile(r"^samplechain serve: router listening on (http://127\.0\.0\.1:\d+) \(up to 4 models at once\)$")


def serve_parser():
    parser = build_parser()
    return command_parser(parser, parser.parse_args(["serve"]))


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "models"
    folder.mkdir()
    for name in ("llama3", "qwen2"):
        shutil.copy(FIXTURES / f"{name}-Q8_0.gguf", folder / f"{name}.gguf")
    return folder


@pytest.fixture
def local_hub(monkeypatch, tmp_path):
    """The stand-in hub with ``test-org/tiny-GGUF`` (one Q8_0 file), this process pointed at it and the hub cache
    under tmp_path; yields (hub, cache folder)."""
    monkeypatch.setattr(hf, "_kept", {})  # no listing kept from another test
    with LocalHub({TINY: {"tiny-Q8_0.gguf": FIXTURES / "llama3-Q8_0.gguf"}}) as hub:
        yield hub, hub.patch(monkeypatch, tmp_path / "hubcache")


def snapshot(hub: LocalHub, cache: Path, repo: str) -> Path:
    return cache / f"models--{repo.replace('/', '--')}" / "snapshots" / hub.sha(repo)


def listing(url: str, headers: dict | None = None) -> dict[str, dict]:
    r = httpx.get(url + "/models", headers=headers or {}, timeout=30)
    assert r.status_code == 200, r.text
    return {m["id"]: m for m in r.json()["data"]}


def complete(url: str, model: str, headers: dict | None = None, seed: int = 7) -> httpx.Response:
    body = {"model": model, "prompt": "number 1", "n_predict": 6, "temperature": 0.8, "seed": seed}
    return httpx.post(url + "/completion", json=body, headers=headers or {}, timeout=120)


def error_of(r: httpx.Response) -> tuple[int, str]:
    return r.status_code, r.json()["error"]["message"]


# --- what the router hands its children ----------------------------------------------------------------------------


def test_child_args_drop_the_routers_own_flags_and_keep_the_rest_in_order():
    parser = serve_parser()
    argv = ["-m", "x", "-c", "512", "--port", "9", "--temp", "0", "--host=h", "--jinja", "--api-key", "k",
            "--sleep-idle-seconds", "1", "--models-dir", "d", "--offline", "--models-max", "2",
            "--no-models-autoload", "--router", "-a", "name", "-np", "2"]
    assert child_args(parser, argv) == ["-c", "512", "--temp", "0", "--jinja", "--sleep-idle-seconds", "1",
                                        "--offline", "-np", "2"]
    # llama.cpp's --a_b spelling is read as the parser reads it: dropped or kept (as written) by the flag it names
    assert child_args(parser, ["--models_dir", "d", "--sleep_idle_seconds", "1", "--api_key=k", "--n_predict", "3",
                               "--models_max", "2", "--no_models_autoload", "--ctx_size=64"]) == [
        "--sleep_idle_seconds", "1", "--n_predict", "3", "--ctx_size=64"]
    # every other router flag, with its value, in each spelling; a repeatable flag and a value like a number stay
    assert child_args(parser, ["--api-key-file", "f", "-hf", "a/b", "--hf-repo=a/b", "-hfr", "a/b", "-hff", "f.gguf",
                               "--alias=x", "--tags", "t", "--models-preset", "p.ini", "--models-autoload", "--model",
                               "y", "--ray", "--replicas", "2", "--ray-address", "r", "-r", "stop", "-r", "end",
                               "--temp", "-1", "--seed=3"]) == ["-r", "stop", "-r", "end", "--temp", "-1", "--seed=3"]
    assert child_args(parser, []) == []
    assert set(ROUTER_FLAGS) <= set(parser._option_string_actions)  # each is a flag of serve's


def test_preset_flags_turn_ini_keys_into_serve_flags():
    flags = preset_flags(serve_parser())
    assert flags("c", "4096") == ["-c", "4096"]
    assert flags("ctx-size", "1") == ["--ctx-size", "1"]
    assert flags("jinja", "false") == ["--no-jinja"]
    assert flags("jinja", "true") == ["--jinja"]
    assert flags("jinja", "0") == ["--no-jinja"]
    assert flags("kv-unified", "off") == ["--no-kv-unified"]
    assert flags("metrics", "false") == []  # a switch with no --no- form: nothing
    assert flags("metrics", "true") == ["--metrics"]
    assert flags("temp", "0.5") == ["--temp", "0.5"]
    assert flags("hf-repo", TINY_Q8) == ["--hf-repo", TINY_Q8]
    assert flags("hf", TINY_Q8) == ["-hf", TINY_Q8]
    assert flags("m", "/x.gguf") == ["-m", "/x.gguf"]
    for key in ("bogus", "load-on-startup"):  # a preset-only key never reaches a child (child_options drops it)
        with pytest.raises(ValueError) as e:
            flags(key, "1")
        assert str(e.value) == f"option '{key}' is not a flag of samplechain serve"


def test_a_preset_with_an_unknown_key_refuses_to_start(tmp_path: Path, models_dir: Path, capsys):
    ini = tmp_path / "presets.ini"
    ini.write_text("[*]\nc = 256\n\n[llama3]\ntemp = 0\nbogus = 1\n")
    config = RouterConfig(server=ServerConfig(port=0), models_dir=str(models_dir), models_preset=str(ini),
                          cache=False, flags=preset_flags(serve_parser()))
    with pytest.raises(ValueError) as e:
        Models(config)
    assert str(e.value) == "--models-preset: [llama3]: option 'bogus' is not a flag of samplechain serve"
    ini.write_text("[*]\nc = 256\n\n[llama3]\ntemp = 0\n")
    models = Models(config)  # the same preset without it is fine, its options the child's flags
    assert models.child_argv(models.table["llama3"])[4:] == [
        "--host", "127.0.0.1", "--port", "0", "--alias", "llama3", "--model", str(models_dir / "llama3.gguf"),
        "-c", "256", "--temp", "0"]
    # through the command line: one line and exit status 1, before anything listens
    ini.write_text("[qwen2]\nfrobnicate = yes\n")
    capsys.readouterr()
    assert main(["serve", "--models-dir", str(models_dir), "--models-preset", str(ini), "--port", "0"]) == 1
    assert capsys.readouterr().err == ("samplechain serve: error: --models-preset: [qwen2]: option 'frobnicate' is "
                                       "not a flag of samplechain serve\n")


def test_remote_presets_take_only_llama_cpps_keys(local_hub, tmp_path: Path, capsys):
    keys = remote_preset_keys(serve_parser())
    assert {"hf-repo", "temp", "top-k", "load-on-startup", "stop-timeout", "dedup-cache-models", "jinja"} <= keys
    assert not {"slot-save-path", "model", "m", "models-dir", "api-key", "port", "host"} & keys
    assert {"hf", "hfr", "b", "ub", "batch-size"} <= keys  # an allowed option by any of its names
    ini = tmp_path / "preset.ini"
    ini.write_text(f"version = 1\n[tiny]\nhf-repo = {TINY_Q8}\ntemp = 0.2\ntop-k = 5\nload-on-startup = false\n")
    config = RouterConfig(server=ServerConfig(port=0), models_preset=str(ini), cache=False,
                          flags=preset_flags(serve_parser()), preset_keys=keys)
    models = Models(config)
    assert models.table["tiny"].spec.options == {"hf-repo": TINY_Q8, "temp": "0.2", "top-k": "5",
                                                 "load-on-startup": "false"}
    assert models.child_argv(models.table["tiny"])[10:] == ["--hf-repo", TINY_Q8, "--temp", "0.2", "--top-k", "5"]
    for line in ("slot-save-path = /tmp", "model = /x.gguf", "LLAMA_ARG_PORT = 1"):
        ini.write_text(f"[tiny]\nhf-repo = {TINY_Q8}\n{line}\n")
        key = line.split(" = ")[0].removeprefix("LLAMA_ARG_").lower()
        with pytest.raises(ValueError) as e:
            Models(config)
        assert str(e.value) == f"--models-preset: {ini}: option '{key}' is not allowed in remote presets"
    # serve -hf with such a repo: one line and exit status 1, before anything listens
    hub, cache = local_hub
    hub.add("test-org/bad-presets", {"preset.ini": f"[tiny]\nhf-repo = {TINY_Q8}\nslot-save-path = /tmp\n".encode()})
    capsys.readouterr()
    assert main(["serve", "-hf", "test-org/bad-presets", "--port", "0"]) == 1
    remote = snapshot(hub, cache, "test-org/bad-presets") / "preset.ini"
    assert capsys.readouterr().err == (
        f"hf: test-org/bad-presets -> preset.ini: downloading from {hub.url} into {cache}\n"
        "note: using preset.ini from Hugging Face repo test-org/bad-presets (router mode)\n"
        f"samplechain serve: error: --models-preset: {remote}: option 'slot-save-path' is not allowed in remote "
        "presets\n")


# --- the router as a process of its own ------------------------------------------------------------------------------


class Process:
    """A ``samplechain serve`` router started as a process; its stderr read on a thread (the children's output is
    echoed there, so it must be drained), ``url`` from its listening line."""

    def __init__(self, args: list[str], env: dict | None = None, timeout: float = 60) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "samplechain", "serve", *args], env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: list[str] = []
        self.listening = threading.Event()
        self.url = ""
        threading.Thread(target=self._read, daemon=True).start()
        if not self.listening.wait(timeout):
            self.kill()
            raise AssertionError("the router did not start:\n" + self.stderr)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            found = LISTENING.match(self.lines[-1])
            if found and not self.listening.is_set():
                self.url = found.group(1)
                self.listening.set()

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    def children(self) -> list[int]:
        """The router's child processes (Linux: /proc/PID/task/*/children)."""
        out: list[int] = []
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            with contextlib.suppress(OSError):
                out += [int(p) for p in (task / "children").read_text().split()]
        return sorted(out)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def router_process(args: list[str], env: dict | None = None) -> Iterator[Process]:
    p = Process(args, env)
    try:
        yield p
    finally:
        p.kill()


def alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_the_router_from_the_command_line(models_dir: Path):
    """``samplechain serve --models-dir``: the folder's models listed unloaded; a request loads one with the
    router's flags less its own (no key on the child's command line); the child sleeps when idle and a request wakes
    it with the same text for the same seed; SIGTERM ends the router (status 0) and its child."""
    key = {"Authorization": "Bearer sk-router-secret"}
    given = [*CHILD, "--temp", "0", "--sleep-idle-seconds", "1"]
    with router_process(["--models-dir", str(models_dir), "--port", "0", "--api-key", "sk-router-secret",
                         *given]) as r:
        assert httpx.get(r.url + "/models").status_code == 401
        models = listing(r.url, key)
        assert {n: (m["status"], m["source"], m["path"]) for n, m in models.items()} == {
            n: ({"value": "unloaded", "args": []}, "models_dir", str(models_dir / f"{n}.gguf"))
            for n in ("llama3", "qwen2")}
        first = complete(r.url, "llama3", key)
        assert first.status_code == 200 and first.json()["model"] == "llama3"
        entry = listing(r.url, key)["llama3"]
        assert entry["status"]["value"] == "loaded" and "failed" not in entry["status"]
        args = entry["status"]["args"]
        # the child's own address (port 0: any free one) and name, its model, then the router's flags less
        # --models-dir, --port and --api-key
        assert args == [sys.executable, "-m", "samplechain", "serve", "--host", "127.0.0.1", "--port", "0",
                        "--alias", "llama3", "--model", str(models_dir / "llama3.gguf"), *given]
        assert args.count("--port") == 1 and "--models-dir" not in args
        assert not [a for a in args if "key" in a.lower() or "sk-" in a]
        assert listing(r.url, key)["qwen2"]["status"] == {"value": "unloaded", "args": []}
        [child] = r.children()
        assert alive(child)
        # idle for --sleep-idle-seconds: the child sleeps (asking it, through /models, does not wake it)
        wait_for(lambda: listing(r.url, key)["llama3"]["status"]["value"] == "sleeping", 10,
                 "llama3 never went to sleep")
        time.sleep(0.5)
        assert listing(r.url, key)["llama3"]["status"]["value"] == "sleeping"
        again = complete(r.url, "llama3", key)  # wakes it: the same text for the same seed
        assert again.status_code == 200 and again.json()["content"] == first.json()["content"]
        assert listing(r.url, key)["llama3"]["status"]["value"] == "loaded"
        assert r.children() == [child]  # the same child woke (no new load)
        assert not [line for line in r.lines if "Traceback" in line]
        started = time.monotonic()
        r.proc.send_signal(signal.SIGTERM)
        assert r.proc.wait(timeout=20) == 0, r.stderr
        assert time.monotonic() - started < 10
        wait_for(lambda: not alive(child), 5, "the child outlived its router")


# --- the hub cache through the router ------------------------------------------------------------------------------


class Events:
    """``GET /models/sse`` read on a thread: each event's JSON put on ``queue``. Started once its first bytes (the
    stream's opening comment) have come, so nothing sent after ``start`` is missed."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        self.conn.request("GET", "/models/sse")
        self.response = self.conn.getresponse()
        assert self.response.status == 200
        assert self.response.readline() == b": subscribed\n"
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with contextlib.suppress(OSError, ValueError, http.client.HTTPException):
            while line := self.response.readline():
                if line.startswith(b"data: "):
                    self.queue.put(json.loads(line[6:]))

    def until(self, event: str, model: str, timeout: float = 60) -> list[dict]:
        """Every event up to the first ``event`` for ``model`` (included)."""
        out: list[dict] = []
        deadline = time.monotonic() + timeout
        while not out or (out[-1]["event"], out[-1]["model"]) != (event, model):
            out.append(self.queue.get(timeout=max(0.01, deadline - time.monotonic())))
        return out

    def drain(self) -> list[dict]:
        out = []
        with contextlib.suppress(queue.Empty):
            while True:
                out.append(self.queue.get(timeout=0.3))
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(timeout=10)
        self.conn.close()


def test_downloads_and_removal_through_the_router(local_hub, models_dir: Path):
    hub, cache = local_hub
    url_of = f"{hub.url}/{TINY}/resolve/{hub.sha(TINY)}/tiny-Q8_0.gguf"
    size = (FIXTURES / "llama3-Q8_0.gguf").stat().st_size
    path = str(snapshot(hub, cache, TINY) / "tiny-Q8_0.gguf")
    with BackgroundRouter(RouterConfig(server=ServerConfig(port=0), models_dir=str(models_dir), cache=True,
                                       child_args=CHILD)) as r:
        assert sorted(listing(r.url)) == ["llama3", "qwen2"]
        events = Events(r.url)
        try:
            answer = httpx.post(r.url + "/models", json={"model": TINY_Q8})
            assert (answer.status_code, answer.json()) == (200, {"success": True})
            got = events.until("download_finished", TINY_Q8)
            assert got == [
                {"model": TINY_Q8, "event": "model_status", "data": {"status": "downloading"}},
                {"model": TINY_Q8, "event": "download_progress", "data": {url_of: {"done": 0, "total": size}}},
                {"model": TINY_Q8, "event": "download_progress", "data": {url_of: {"done": size, "total": size}}},
                {"model": "*", "event": "models_reload"},
                {"model": TINY_Q8, "event": "download_finished", "data": {"path": path}}]
            assert Path(path).read_bytes() == (FIXTURES / "llama3-Q8_0.gguf").read_bytes()
            entry = listing(r.url)[TINY_Q8]
            assert (entry["source"], entry["path"], entry["status"], entry["can_remove"]) == (
                "cache", path, {"value": "unloaded", "args": []}, True)
            assert (listing(r.url)["llama3"]["can_remove"], sorted(listing(r.url))) == (
                False, ["llama3", "qwen2", TINY_Q8])
            assert error_of(httpx.post(r.url + "/models", json={"model": TINY_Q8})) == (
                400, f"model '{TINY_Q8}' already exists")
            assert error_of(httpx.post(r.url + "/models", json={"model": " "})) == (
                400, "model must be a non-empty string")
            # a repo the hub does not have: the download fails, with the hub's answer, and nothing is listed
            nope = "test-org/nope-GGUF:Q8_0"
            assert httpx.post(r.url + "/models", json={"model": nope}).json() == {"success": True}
            assert events.until("download_failed", nope) == [
                {"model": nope, "event": "model_status", "data": {"status": "downloading"}},
                {"model": nope, "event": "download_failed", "data": {"error": (
                    f"Hugging Face repo test-org/nope-GGUF not found at {hub.url}: check its name; a private or "
                    f"gated repo needs a token (-hft/--hf-token or $HF_TOKEN)")}}]
            assert nope not in listing(r.url) and r.models.downloads == {}
            # the downloaded model runs (from its cached file), then is removed while it runs: stopped first
            served = complete(r.url, TINY_Q8)
            assert served.status_code == 200 and served.json()["model"] == TINY_Q8
            assert listing(r.url)[TINY_Q8]["status"]["args"][8:12] == ["--alias", TINY_Q8, "--model", path]
            events.drain()
            gone = httpx.delete(r.url + "/models", params={"model": TINY_Q8}, timeout=60)
            assert (gone.status_code, gone.json()) == (200, {"success": True})
            assert events.until("model_remove", TINY_Q8, timeout=10) == [
                {"model": TINY_Q8, "event": "model_status", "data": {"status": "unloaded"}},
                {"model": TINY_Q8, "event": "model_remove"}]
            assert sorted(listing(r.url)) == ["llama3", "qwen2"]
            assert not (cache / f"models--{TINY.replace('/', '--')}").exists()
            assert r.models.table.keys() == {"llama3", "qwen2"}
        finally:
            events.close()
        # only the cache's models can be removed; an unknown one is a 404
        assert error_of(httpx.delete(r.url + "/models", params={"model": "llama3"})) == (
            400, "model 'llama3' is not in the hub cache (models_dir): only cached models can be removed")
        for unknown in (TINY_Q8, "nope"):
            e = httpx.delete(r.url + "/models", params={"model": unknown})
            assert error_of(e) == (404, f"{unknown} is not a model in the hub cache ({cache})")
            assert e.json()["error"]["type"] == "not_found_error"
        assert error_of(httpx.delete(r.url + "/models")) == (400, "model must be a non-empty string")
        assert (models_dir / "llama3.gguf").is_file()


def test_dedup_cache_models_hides_the_cache_entry_a_preset_names(local_hub, tmp_path: Path):
    hub, cache = local_hub
    path = download_model(TINY_Q8)
    assert path == str(snapshot(hub, cache, TINY) / "tiny-Q8_0.gguf")
    ini = tmp_path / "presets.ini"
    for dedup, listed in ((True, ["mine"]), (False, ["mine", TINY_Q8])):
        ini.write_text(f"[mine]\nhf-repo = {TINY_Q8}\n" + ("dedup-cache-models = true\n" if dedup else ""))
        with BackgroundRouter(RouterConfig(server=ServerConfig(port=0), models_preset=str(ini), cache=True)) as r:
            models = listing(r.url)
            assert sorted(models) == listed
            assert (models["mine"]["source"], models["mine"]["path"], models["mine"]["status"]["preset"]) == (
                "preset", None, ini.read_text())
            assert r.models.table[TINY_Q8].spec.hidden is dedup  # hidden from the list only
            if not dedup:
                assert (models[TINY_Q8]["source"], models[TINY_Q8]["path"]) == ("cache", path)


def test_a_preset_repo_under_hf_starts_a_router(tmp_path: Path):
    """``samplechain serve -hf USER/PRESETS``, the repo holding only a preset.ini: a router over its models, whose
    child downloads its model from the hub."""
    preset = f"[tiny]\nhf-repo = {TINY_Q8}\n".encode()
    repos = {TINY: {"tiny-Q8_0.gguf": FIXTURES / "llama3-Q8_0.gguf"}, "test-org/presets": {"preset.ini": preset}}
    with LocalHub(repos) as hub:
        env = hub.environ(tmp_path)
        cache = Path(env["HF_HUB_CACHE"])
        with router_process(["-hf", "test-org/presets", "--port", "0", *CHILD], env) as r:
            assert r.lines[:2] == [
                f"hf: test-org/presets -> preset.ini: downloading from {hub.url} into {cache}",
                "note: using preset.ini from Hugging Face repo test-org/presets (router mode)"]
            models = listing(r.url)
            assert sorted(models) == ["tiny"]
            assert (models["tiny"]["source"], models["tiny"]["status"]["preset"]) == ("preset", preset.decode())
            answer = complete(r.url, "tiny")
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == "tiny" and answer.json()["content"]
            assert listing(r.url)["tiny"]["status"]["args"][4:] == [
                "--host", "127.0.0.1", "--port", "0", "--alias", "tiny", "--hf-repo", TINY_Q8, *CHILD]
            assert hub.downloads() == [f"/test-org/presets/resolve/{hub.sha('test-org/presets')}/preset.ini",
                                       f"/{TINY}/resolve/{hub.sha(TINY)}/tiny-Q8_0.gguf"]
            r.proc.send_signal(signal.SIGTERM)
            assert r.proc.wait(timeout=20) == 0, r.stderr


def test_abbreviations_attached_values_tokens_and_short_negations():
    """serve takes no abbreviated flag (its router passes flags on by name), ``-mFILE`` and ``-hft`` stay with the
    router (the token reaches children as $HF_TOKEN, never on a command line), ``kvu = false`` is ``-no-kvu``."""
    parser = serve_parser()
    with pytest.raises(SystemExit):
        main(["serve", "--models-d", "/tmp"])
    assert child_args(parser, ["-mx.gguf", "-afoo", "-hft", "hf_secret", "-c512", "--temp", "0"]) == [
        "-c512", "--temp", "0"]
    assert preset_flags(parser)("kvu", "false") == ["-no-kvu"]
    assert preset_flags(parser)("kvu", "true") == ["-kvu"]
