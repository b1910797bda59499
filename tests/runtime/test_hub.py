"""``-hf`` (runtime/hub.py): llama.cpp's choice of file, downloads into the hub cache, offline mode, one-line errors,
``Model.from_pretrained``, split models, ``cached_models`` and ``remove_cached``, download progress, preset repos, end
to end against a stand-in for the hub on 127.0.0.1 (tests/local_hub.py); nothing goes to huggingface.co."""

from __future__ import annotations

import filecmp
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from local_hub import LocalHub, split_gguf
from samplechain import SamplingParams
from samplechain.cli import build_parser, main
from samplechain.gguf import GGUFError, GGUFFile
from samplechain.runtime import Model, hub_cache, load_model
from samplechain.runtime import hub as hf
from samplechain.runtime.hub import download_model, preset_file
from samplechain.runtime.hub_cache import (
    CachedModel,
    best_file,
    cached_models,
    remove_cached,
    split_info,
    split_parts,
)

MODELS = Path(__file__).resolve().parents[1] / "fixtures" / "models"
LLAMA = "test-org/tiny-llama3-GGUF"
QUANTS = ("Q4_K_M", "Q6_K", "Q8_0")
GREEDY = SamplingParams(temperature=0)


def llama_repo(quants=QUANTS, extra=None) -> dict:
    files = {f"tiny-llama3-{q}.gguf": MODELS / f"llama3-{q}.gguf" for q in quants}
    return {**files, "README.md": b"# tiny llama3\n", **(extra or {})}


def text(path, prompt="hi", n=8) -> str:
    return "".join(load_model(path).generate(prompt, GREEDY, n))


@pytest.fixture
def local_hub(monkeypatch, tmp_path):
    """A stand-in hub with the test repos, this process pointed at it (environment and huggingface_hub's
    constants) and the hub cache under tmp_path; yields (hub, cache folder)."""
    repos = {LLAMA: llama_repo(),
             "test-org/no-q4-GGUF": llama_repo(("Q6_K", "Q8_0")),
             "test-org/odd-GGUF": {"tiny-F16.gguf": MODELS / "llama3-Q6_K.gguf",
                                   "mmproj-tiny-Q4_K_M.gguf": MODELS / "qwen2-Q8_0.gguf",
                                   "tiny-Q6_K.gguf": MODELS / "llama3-Q8_0.gguf"}}
    repos["test-org/private-GGUF"] = llama_repo(("Q8_0",))
    monkeypatch.setattr(hf, "_kept", {})  # no listing kept by preset_file from one test for another
    with LocalHub(repos, private={"test-org/private-GGUF": "hf_secret"}) as hub:
        cache = hub.patch(monkeypatch, tmp_path)
        yield hub, cache


def snapshot(hub: LocalHub, cache: Path, repo: str) -> Path:
    return cache / f"models--{repo.replace('/', '--')}" / "snapshots" / hub.sha(repo)


def test_file_names_are_read_as_llama_cpp_reads_them():
    assert split_info("tiny-llama3-Q4_K_M.gguf") == hub_cache.SplitInfo("tiny-llama3-Q4_K_M", "Q4_K_M", 1, 1)
    assert split_info("sub/model-q8_0-00002-of-00003.gguf") == hub_cache.SplitInfo("sub/model-q8_0", "Q8_0", 2, 3)
    assert split_info("bert-bge-small/ggml-model-f16.gguf").tag == "F16"
    assert split_info("Llama-3.2-1B.gguf").tag == "1B"  # the last [-.]-separated word, as llama.cpp's regex
    assert split_info("tinyllamas/stories260K.gguf").tag == ""
    assert split_info("README.md") is None
    assert hub_cache.split_repo_tag("ggml-org/tinygemma3-GGUF:q8_0") == ("ggml-org/tinygemma3-GGUF", "q8_0")
    assert hub_cache.split_repo_tag("ggml-org/models") == ("ggml-org/models", "")
    for bad in ("models", "a/b/c", "a//b", "/b", "a/b c:Q8_0"):
        with pytest.raises(ValueError, match="expected <user>/<model>\\[:quant\\]"):
            hub_cache.split_repo_tag(bad)


def test_the_file_is_chosen_as_llama_cpp_chooses_it():
    files = ["README.md", "tiny-Q4_K_M.gguf", "tiny-Q6_K.gguf", "tiny-Q8_0.gguf"]
    assert best_file(files) == "tiny-Q4_K_M.gguf"  # no tag: Q4_K_M
    assert best_file(files, "q6_k") == "tiny-Q6_K.gguf"  # case-insensitive
    assert best_file(files, "Q5_K_M") is None
    assert best_file(files, "Q4_K") is None  # the tag must be followed by '.' or '-'
    assert best_file(["tiny-Q6_K.gguf", "tiny-Q8_0.gguf"]) == "tiny-Q8_0.gguf"  # then Q8_0
    assert best_file(["tiny-F16.gguf", "tiny-Q6_K.gguf"]) == "tiny-F16.gguf"  # then the first GGUF
    assert best_file(["mmproj-tiny-Q4_K_M.gguf", "tiny-imatrix.gguf", "tiny-Q6_K.gguf"]) == "tiny-Q6_K.gguf"
    assert best_file(["README.md", "mmproj-F16.gguf"]) is None
    split = ["big-Q4_K_M-00002-of-00002.gguf", "big-Q4_K_M-00001-of-00002.gguf", "big-Q8_0.gguf"]
    assert best_file(split) == "big-Q4_K_M-00001-of-00002.gguf"
    assert split_parts(split, "big-Q4_K_M-00001-of-00002.gguf") == [
        "big-Q4_K_M-00001-of-00002.gguf", "big-Q4_K_M-00002-of-00002.gguf"]
    assert split_parts(split, "big-Q8_0.gguf") == ["big-Q8_0.gguf"]


def test_the_cache_folder_is_llama_cpps(monkeypatch, tmp_path):
    for var in ("LLAMA_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub_cache.cache_dir() == str(tmp_path / ".cache" / "huggingface" / "hub")
    expected = [("XDG_CACHE_HOME", tmp_path / "xdg" / "huggingface" / "hub"), ("HF_HOME", tmp_path / "home" / "hub"),
                ("HUGGINGFACE_HUB_CACHE", tmp_path / "old"), ("HF_HUB_CACHE", tmp_path / "hub"),
                ("LLAMA_CACHE", tmp_path / "llama")]
    for var, folder in expected:  # each variable takes precedence over the ones set before it
        monkeypatch.setenv(var, str(tmp_path / {"XDG_CACHE_HOME": "xdg", "HF_HOME": "home"}.get(var, folder.name)))
        assert hub_cache.cache_dir() == str(folder)
    monkeypatch.delenv("MODEL_ENDPOINT", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1/")
    assert hf.endpoint() == "http://127.0.0.1:1"
    monkeypatch.setenv("MODEL_ENDPOINT", "http://127.0.0.1:2")
    assert hf.endpoint() == "http://127.0.0.1:2"


def test_download_then_the_cache_then_offline(local_hub, monkeypatch, capsys):
    hub, cache = local_hub
    want = snapshot(hub, cache, LLAMA) / "tiny-llama3-Q8_0.gguf"
    sha = hub.sha(LLAMA)
    assert download_model(f"{LLAMA}:Q8_0") == str(want)
    assert filecmp.cmp(want, MODELS / "llama3-Q8_0.gguf", shallow=False)
    assert hub.repo_requests() == [("GET", f"/api/models/{LLAMA}/revision/main"),
                                   ("HEAD", f"/{LLAMA}/resolve/{sha}/tiny-llama3-Q8_0.gguf"),
                                   ("GET", f"/{LLAMA}/resolve/{sha}/tiny-llama3-Q8_0.gguf")]
    assert (cache / f"models--{LLAMA.replace('/', '--')}" / "refs" / "main").read_text() == sha
    hub.requests.clear()
    assert download_model(f"{LLAMA}:q8_0") == str(want)  # in the cache: the listing only, nothing downloaded
    assert hub.repo_requests() == [("GET", f"/api/models/{LLAMA}/revision/main")]
    hub.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert download_model(f"{LLAMA}:Q8_0") == str(want)  # offline: no request at all
    assert hub.requests == []
    assert capsys.readouterr().err.splitlines() == [
        f"hf: {LLAMA}:Q8_0 -> tiny-llama3-Q8_0.gguf: downloading from {hub.url} into {cache}",
        f"hf: {LLAMA}:q8_0 -> tiny-llama3-Q8_0.gguf: in the cache",
        f"hf: {LLAMA}:Q8_0 -> tiny-llama3-Q8_0.gguf: in the cache (offline)"]


def test_quant_choice_and_hf_file(local_hub):
    hub, cache = local_hub

    def got(*args, **kwargs):
        path = Path(download_model(*args, **kwargs))
        assert path.parent == snapshot(hub, cache, args[0].split(":")[0])
        return path.name

    assert got(LLAMA) == "tiny-llama3-Q4_K_M.gguf"
    assert got(f"{LLAMA}:q6_k") == "tiny-llama3-Q6_K.gguf"
    assert got(LLAMA, "Q8_0") == "tiny-llama3-Q8_0.gguf"
    assert got("test-org/no-q4-GGUF") == "tiny-llama3-Q8_0.gguf"
    assert got("test-org/odd-GGUF") == "tiny-F16.gguf"  # the first GGUF; never the mmproj file
    assert got(f"{LLAMA}:Q8_0", filename="tiny-llama3-Q6_K.gguf") == "tiny-llama3-Q6_K.gguf"  # the file wins
    assert filecmp.cmp(snapshot(hub, cache, "test-org/odd-GGUF") / "tiny-F16.gguf", MODELS / "llama3-Q6_K.gguf",
                       shallow=False)
    with pytest.raises(ValueError, match="two quants for test-org/tiny-llama3-GGUF: 'Q8_0' in the repo"):
        download_model(f"{LLAMA}:Q8_0", "Q6_K")


def run_main(args, capsys) -> tuple[int, str, str]:
    status = main(args)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def one_line_error(args, capsys, command="generate") -> str:
    status, _, err = run_main(args, capsys)
    lines = [line for line in err.splitlines() if not line.startswith("hf: ")]
    assert status == 1 and len(lines) == 1 and lines[0].startswith(f"samplechain {command}: error: "), err
    return lines[0].removeprefix(f"samplechain {command}: error: ")


def test_errors_are_one_line(local_hub, monkeypatch, capsys):
    hub, cache = local_hub
    base = ["generate", "-p", "hi", "-n", "2"]
    assert one_line_error([*base, "-hf", "test-org/nope"], capsys) == (
        f"Hugging Face repo test-org/nope not found at {hub.url}: check its name; a private or gated repo needs a "
        "token (-hft/--hf-token or $HF_TOKEN)")
    assert one_line_error([*base, "-hf", f"{LLAMA}:Q5_K_M"], capsys) == (
        f"{LLAMA} has no Q5_K_M GGUF file (its quants: Q4_K_M, Q6_K, Q8_0)")
    assert one_line_error([*base, "-hf", LLAMA, "-hff", "nope.gguf"], capsys) == (
        f"{LLAMA} has no file 'nope.gguf' (its GGUF files: tiny-llama3-Q4_K_M.gguf, tiny-llama3-Q6_K.gguf, "
        "tiny-llama3-Q8_0.gguf)")
    assert one_line_error([*base, "-hf", "nope"], capsys) == (
        "invalid Hugging Face repo 'nope': expected <user>/<model>[:quant]")
    assert one_line_error([*base, "-hff", "tiny-llama3-Q6_K.gguf"], capsys) == (
        "-hff/--hf-file names a file of the -hf/--hf-repo repo: give -hf too")
    hub.requests.clear()
    assert one_line_error([*base, "--offline", "-hf", f"{LLAMA}:Q8_0"], capsys) == (
        f"offline mode (HF_HUB_OFFLINE=1, --offline) downloads nothing, and {LLAMA}:Q8_0 is not in the hub cache "
        f"({cache})")
    assert hub.requests == []
    with socket.socket() as s:  # a port nothing listens on: the hub cannot be reached
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", closed)
    assert one_line_error([*base, "-hf", f"{LLAMA}:Q8_0"], capsys) == (
        f"cannot reach the Hugging Face hub at {closed} (no network? ConnectError: [Errno 111] Connection refused; "
        f"HF_HUB_OFFLINE=1 uses the models already in the hub cache without a network), and {LLAMA}:Q8_0 is not in "
        f"the hub cache ({cache})")


def test_without_the_hub_the_cache_is_used(local_hub, monkeypatch, capsys):
    _, cache = local_hub
    path = download_model(f"{LLAMA}:Q8_0")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", closed)
    capsys.readouterr()
    assert download_model(f"{LLAMA}:Q8_0") == path
    assert capsys.readouterr().err == (
        f"hf: {LLAMA}:Q8_0 -> tiny-llama3-Q8_0.gguf: cannot reach {closed}: the cached copy\n")
    with pytest.raises(FileNotFoundError) as e:  # the repo is cached, this quant is not: the cached ones are named
        download_model(f"{LLAMA}:Q6_K")
    assert str(e.value).endswith(f"and {LLAMA} has no Q6_K GGUF file in the hub cache ({cache}) (its cached quants: "
                                 "Q8_0)")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"^offline mode \(HF_HUB_OFFLINE=1, --offline\) downloads nothing, "
                                                r"and test-org/tiny-llama3-GGUF has no Q6_K GGUF file in the hub"):
        download_model(f"{LLAMA}:Q6_K")


def test_a_private_repo_needs_its_token(local_hub, monkeypatch, capsys):
    hub, cache = local_hub
    repo = "test-org/private-GGUF"
    with pytest.raises(FileNotFoundError, match=f"^Hugging Face repo {repo} not found at "):
        download_model(repo)
    want = str(snapshot(hub, cache, repo) / "tiny-llama3-Q8_0.gguf")
    assert download_model(repo, token="hf_secret") == want
    status, _, err = run_main(["generate", "-hf", repo, "-hft", "hf_secret", "-p", "hi", "-n", "8", "--temp", "0",
                               "--no-perf", "--no-display-prompt"], capsys)
    assert status == 0 and f"loading model {want} ..." in err
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    hub.requests.clear()
    assert download_model(repo) == want and hub.repo_requests() == [("GET", f"/api/models/{repo}/revision/main")]


def test_from_pretrained_loads_what_hf_names(local_hub):
    hub, cache = local_hub
    model = Model.from_pretrained(f"{LLAMA}:Q8_0")
    assert model.path == str(snapshot(hub, cache, LLAMA) / "tiny-llama3-Q8_0.gguf")
    assert "".join(model.generate("hi", GREEDY, 8)) == text(MODELS / "llama3-Q8_0.gguf")
    assert Model.from_pretrained(LLAMA, "q6_k", n_threads=1).path.endswith("/tiny-llama3-Q6_K.gguf")
    assert Model.from_pretrained(LLAMA, filename="tiny-llama3-Q8_0.gguf", offline=True).path == model.path


def test_a_split_model_is_downloaded_whole_and_loads(local_hub, tmp_path, capsys):
    hub, cache = local_hub
    parts = split_gguf(MODELS / "llama3-Q8_0.gguf", tmp_path, "tiny-Q8_0", 2)
    repo = "test-org/split-GGUF"
    hub.add(repo, {p.name: p for p in parts} | {"tiny-Q4_K_M.gguf": MODELS / "llama3-Q4_K_M.gguf"})
    path = Path(download_model(f"{repo}:Q8_0"))
    assert path == snapshot(hub, cache, repo) / "tiny-Q8_0-00001-of-00002.gguf"
    assert sorted(p.name for p in path.parent.iterdir()) == ["tiny-Q8_0-00001-of-00002.gguf",
                                                             "tiny-Q8_0-00002-of-00002.gguf"]
    assert hub.downloads() == [f"/{repo}/resolve/{hub.sha(repo)}/{p.name}" for p in parts]
    assert capsys.readouterr().err == (f"hf: {repo}:Q8_0 -> tiny-Q8_0-00001-of-00002.gguf (+1 more part): "
                                       f"downloading from {hub.url} into {cache}\n")
    whole, split = GGUFFile(MODELS / "llama3-Q8_0.gguf"), GGUFFile(path)
    assert len(split.parts) == 1 and list(split.tensors) == list(whole.tensors)
    assert split.metadata["split.count"] == 2 and len(split.parts[0].tensors) == 11
    assert text(path) == text(MODELS / "llama3-Q8_0.gguf")  # the same greedy tokens as the file it was split from
    with pytest.raises(GGUFError, match=r"part 2 of a split model of 2: load tiny-Q8_0-00001-of-00002\.gguf$"):
        GGUFFile(parts[1])
    parts[1].unlink()
    with pytest.raises(GGUFError, match="part 2 of 2 of the split model is missing: "):
        GGUFFile(parts[0])


def test_cached_models_are_named_as_llama_cpps_router_names_them(local_hub, tmp_path):
    hub, cache = local_hub
    parts = split_gguf(MODELS / "llama3-Q8_0.gguf", tmp_path, "tiny-Q8_0", 2)
    hub.add("test-org/split-GGUF", {p.name: p for p in parts})
    hub.add("ggml-org/models", {"tinyllamas/stories260K.gguf": MODELS / "llama3-Q6_K.gguf",
                                "bert-bge-small/ggml-model-f16.gguf": MODELS / "qwen2-Q6_K.gguf"})
    assert cached_models() == []
    for args in ((LLAMA, "Q8_0"), (LLAMA, "Q4_K_M"), ("test-org/odd-GGUF",), ("test-org/split-GGUF",)):
        download_model(*args)
    download_model("test-org/odd-GGUF", filename="mmproj-tiny-Q4_K_M.gguf")
    download_model("ggml-org/models", filename="tinyllamas/stories260K.gguf")
    download_model("ggml-org/models", filename="bert-bge-small/ggml-model-f16.gguf")
    (cache / "datasets--test-org--data" / "snapshots").mkdir(parents=True)  # not a model repo
    snap = {repo: snapshot(hub, cache, repo) for repo in hub.repos}
    assert cached_models() == [
        CachedModel("ggml-org/models:F16", "ggml-org/models", "F16", "bert-bge-small/ggml-model-f16.gguf",
                    str(snap["ggml-org/models"] / "bert-bge-small" / "ggml-model-f16.gguf")),  # stories260K: no tag
        CachedModel("test-org/odd-GGUF:F16", "test-org/odd-GGUF", "F16", "tiny-F16.gguf",
                    str(snap["test-org/odd-GGUF"] / "tiny-F16.gguf")),  # mmproj-...: not a model
        CachedModel("test-org/split-GGUF:Q8_0", "test-org/split-GGUF", "Q8_0", "tiny-Q8_0-00001-of-00002.gguf",
                    str(snap["test-org/split-GGUF"] / "tiny-Q8_0-00001-of-00002.gguf")),
        CachedModel(f"{LLAMA}:Q4_K_M", LLAMA, "Q4_K_M", "tiny-llama3-Q4_K_M.gguf",
                    str(snap[LLAMA] / "tiny-llama3-Q4_K_M.gguf")),
        CachedModel(f"{LLAMA}:Q8_0", LLAMA, "Q8_0", "tiny-llama3-Q8_0.gguf",
                    str(snap[LLAMA] / "tiny-llama3-Q8_0.gguf"))]
    for m in cached_models():  # each id loads, offline, the listed file
        assert download_model(m.id, offline=True) == m.path
    (snap["test-org/split-GGUF"] / "tiny-Q8_0-00002-of-00002.gguf").unlink()  # an incomplete split is not listed
    assert "test-org/split-GGUF:Q8_0" not in [m.id for m in cached_models()]
    assert cached_models(tmp_path / "elsewhere") == []


def blob(hub: LocalHub, cache: Path, repo: str, path: str) -> str:
    return str(cache / f"models--{repo.replace('/', '--')}" / "blobs" / hub.repos[repo].sha256[path])


def test_download_progress_reports_each_file_by_its_url(local_hub, tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    hub, _ = local_hub
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 1 << 16)  # several updates per file
    parts = split_gguf(MODELS / "llama3-Q8_0.gguf", tmp_path, "tiny-Q8_0", 2)
    repo = "test-org/split-GGUF"
    hub.add(repo, {p.name: p for p in parts})
    urls = [f"{hub.url}/{repo}/resolve/{hub.sha(repo)}/{p.name}" for p in parts]
    sizes = [p.stat().st_size for p in parts]
    calls = []
    capsys.readouterr()
    path = download_model(f"{repo}:Q8_0", progress=lambda *call: calls.append(call))
    assert path.endswith("/tiny-Q8_0-00001-of-00002.gguf") and len(calls) > 10
    assert calls == [(url, min(done, size), size) for url, size in zip(urls, sizes, strict=True)
                     for done in range(0, size + (1 << 16), 1 << 16)]  # from 0, a chunk at a time, to (size, size)
    assert capsys.readouterr().err.count("\n") == 1  # the "hf: ..." line, no bar
    calls.clear()  # in the cache: each file once, done
    assert download_model(f"{repo}:Q8_0", progress=lambda *call: calls.append(call)) == path
    assert calls == [(url, size, size) for url, size in zip(urls, sizes, strict=True)]
    calls.clear()
    assert download_model(f"{repo}:Q8_0", offline=True, progress=lambda *call: calls.append(call)) == path
    assert calls == [(url, size, size) for url, size in zip(urls, sizes, strict=True)]


def test_remove_cached_removes_one_quant(local_hub):
    hub, cache = local_hub
    for quant in ("Q8_0", "Q4_K_M"):
        download_model(f"{LLAMA}:{quant}")
    snap = snapshot(hub, cache, LLAMA)
    assert remove_cached(f"{LLAMA}:q8_0") == [str(snap / "tiny-llama3-Q8_0.gguf"),
                                              blob(hub, cache, LLAMA, "tiny-llama3-Q8_0.gguf")]
    assert [m.id for m in cached_models()] == [f"{LLAMA}:Q4_K_M"]
    assert sorted(p.name for p in snap.iterdir()) == ["tiny-llama3-Q4_K_M.gguf"]
    assert download_model(f"{LLAMA}:Q4_K_M", offline=True) == str(snap / "tiny-llama3-Q4_K_M.gguf")
    with pytest.raises(FileNotFoundError) as e:
        download_model(f"{LLAMA}:Q8_0", offline=True)
    assert str(e.value) == (f"offline mode (HF_HUB_OFFLINE=1, --offline) downloads nothing, and {LLAMA} has no Q8_0 "
                            f"GGUF file in the hub cache ({cache}) (its cached quants: Q4_K_M)")
    for model_id in (f"{LLAMA}:Q8_0", LLAMA, "test-org/nope:Q8_0", "nope"):
        with pytest.raises(FileNotFoundError) as e:
            remove_cached(model_id)
        assert str(e.value) == f"{model_id} is not a model in the hub cache ({cache})"
    with pytest.raises(FileNotFoundError, match="is not a model in the hub cache"):
        remove_cached(f"{LLAMA}:Q4_K_M", cache / "elsewhere")


def test_remove_cached_keeps_shared_blobs_and_the_rest_of_the_repo(local_hub, tmp_path):
    hub, cache = local_hub
    same = "test-org/same-GGUF"  # two quants with the same bytes: one blob
    hub.add(same, {"a-Q8_0.gguf": MODELS / "llama3-Q8_0.gguf", "b-Q6_K.gguf": MODELS / "llama3-Q8_0.gguf"})
    models = "ggml-org/models"
    hub.add(models, {"tinyllamas/stories260K.gguf": MODELS / "llama3-Q6_K.gguf",
                     "bert-bge-small/ggml-model-f16.gguf": MODELS / "qwen2-Q6_K.gguf"})
    for args in ((same, "Q8_0"), (same, "Q6_K")):
        download_model(*args)
    download_model(models, filename="tinyllamas/stories260K.gguf")
    download_model(models, filename="bert-bge-small/ggml-model-f16.gguf")
    assert remove_cached(f"{same}:Q8_0") == [str(snapshot(hub, cache, same) / "a-Q8_0.gguf")]  # the blob stays
    assert filecmp.cmp(download_model(f"{same}:Q6_K", offline=True), MODELS / "llama3-Q8_0.gguf", shallow=False)
    snap = snapshot(hub, cache, models)
    assert remove_cached(f"{models}:F16") == [str(snap / "bert-bge-small" / "ggml-model-f16.gguf"),
                                              blob(hub, cache, models, "bert-bge-small/ggml-model-f16.gguf")]
    assert sorted(p.name for p in snap.iterdir()) == ["tinyllamas"]  # the emptied folder goes, the untagged file stays


def test_removing_the_last_model_removes_the_repo(local_hub, tmp_path):
    hub, cache = local_hub
    parts = split_gguf(MODELS / "llama3-Q8_0.gguf", tmp_path, "tiny-Q8_0", 2)
    repo = "test-org/split-GGUF"
    hub.add(repo, {p.name: p for p in parts})
    download_model(repo)
    folder = cache / "models--test-org--split-GGUF"
    assert remove_cached(f"{repo}:Q8_0") == [
        *(str(snapshot(hub, cache, repo) / p.name) for p in parts),
        *sorted(blob(hub, cache, repo, p.name) for p in parts), str(folder)]
    assert not folder.exists() and cached_models() == []


def test_preset_repos(local_hub, monkeypatch, capsys):
    hub, cache = local_hub
    ini = b"version = 1\n\n[test-org/tiny-llama3-GGUF:Q8_0]\nc = 256\n"
    repo = "test-org/preset-repo"
    hub.add(repo, {"preset.ini": ini, "README.md": b"# a preset\n"})
    hub.add("test-org/both", {"preset.ini": ini, "tiny-Q8_0.gguf": MODELS / "llama3-Q8_0.gguf"})
    hub.add("test-org/deep", {"sub/preset.ini": ini, "tiny-Q8_0.gguf": MODELS / "llama3-Q8_0.gguf"})
    capsys.readouterr()
    path = preset_file(repo)
    assert path == str(snapshot(hub, cache, repo) / "preset.ini") and Path(path).read_bytes() == ini
    assert capsys.readouterr().err == f"hf: {repo} -> preset.ini: downloading from {hub.url} into {cache}\n"
    assert preset_file("test-org/both:Q8_0") == str(snapshot(hub, cache, "test-org/both") / "preset.ini")
    assert hub.downloads() == [f"/{r}/resolve/{hub.sha(r)}/preset.ini" for r in (repo, "test-org/both")]
    listing = ("GET", f"/api/models/{LLAMA}/revision/main")
    hub.requests.clear()  # a model repo: None, and download_model after it lists nothing more
    assert preset_file(LLAMA) is None and hub.repo_requests() == [listing]
    download_model(f"{LLAMA}:Q8_0")
    assert hub.repo_requests().count(listing) == 1
    download_model(f"{LLAMA}:Q8_0")  # the kept listing is used once
    assert hub.repo_requests().count(listing) == 2
    monkeypatch.setattr(hf, "KEEP_S", 0.0)  # kept too long: asked again
    assert preset_file(LLAMA) is None and download_model(f"{LLAMA}:Q8_0")
    assert hub.repo_requests().count(listing) == 4
    assert preset_file("test-org/deep") is None  # only at the repo's root
    hub.requests.clear()  # offline: from the cache, no request
    assert preset_file(repo, offline=True) == path and preset_file(LLAMA, offline=True) is None
    assert preset_file("test-org/not-cached", offline=True) is None and hub.requests == []
    with socket.socket() as s:  # the hub out of reach: the cached copy
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", closed)
    capsys.readouterr()
    assert preset_file(repo) == path and preset_file(LLAMA) is None
    assert capsys.readouterr().err == f"hf: {repo} -> preset.ini: cannot reach {closed}: the cached copy\n"
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    with pytest.raises(FileNotFoundError, match=r"^Hugging Face repo test-org/nope not found at "):
        preset_file("test-org/nope")


def test_remote_preset_keys_are_llama_cpps():
    assert hf.REMOTE_PRESET_KEYS == {"model-url", "hf-repo", "hf-repo-draft", "hf-repo-v", "hf-file-v", "mmproj-url",
                                     "pooling", "jinja", "batch-size", "ubatch-size", "cache-reuse",
                                     "chat-template-kwargs", "mmap"}


def test_the_flags_are_llama_cpps():
    parser = build_parser()
    args = parser.parse_args(["generate", "-hf", f"{LLAMA}:Q8_0", "-hff", "f.gguf", "-hft", "tok", "-hfd", "a/b"])
    assert (args.hf_repo, args.hf_file, args.hf_token, args.hf_repo_draft, args.offline) == (
        f"{LLAMA}:Q8_0", "f.gguf", "tok", "a/b", False)  # -hf is no longer -h f
    for flags in (["-hfr", "x/y", "-hfrd", "z/w"], ["--hf-repo", "x/y", "--hf-repo-draft", "z/w"],
                  ["--hf-repo=x/y", "--spec-draft-hf", "z/w", "--offline"]):
        args = parser.parse_args(["serve", *flags])
        assert (args.hf_repo, args.hf_repo_draft) == ("x/y", "z/w")
    args = parser.parse_args(["trace", "-p", "x", "-hf", "x/y", "--hf-file", "f.gguf", "--hf-token", "t"])
    assert (args.hf_repo, args.hf_file, args.hf_token) == ("x/y", "f.gguf", "t")


def test_generate_hf_and_hfd(local_hub, capsys):
    hub, cache = local_hub
    base = ["generate", "-p", "hi", "-n", "8", "--temp", "0", "--no-perf"]
    status, want, _ = run_main([*base, "-m", str(MODELS / "llama3-Q8_0.gguf")], capsys)
    assert status == 0
    status, out, err = run_main([*base, "-hf", f"{LLAMA}:Q8_0", "-m", "ignored.gguf"], capsys)
    assert status == 0 and out == want
    assert err.splitlines()[:3] == [
        f"note: -m ignored.gguf is not used: the model is {LLAMA}:Q8_0's (-hf)",
        f"hf: {LLAMA}:Q8_0 -> tiny-llama3-Q8_0.gguf: downloading from {hub.url} into {cache}",
        f"loading model {snapshot(hub, cache, LLAMA) / 'tiny-llama3-Q8_0.gguf'} ..."]
    # a draft model from the hub: the same text, drafted (-md names the draft repo's file, as in llama.cpp)
    status, out, err = run_main([*base, "-hf", f"{LLAMA}:Q8_0", "--spec-type", "draft-simple", "-hfd", LLAMA,
                                 "-md", "tiny-llama3-Q6_K.gguf", "--draft-max", "4"], capsys)
    assert status == 0 and out == want and "draft-simple" in err
    assert f"loading model {snapshot(hub, cache, LLAMA) / 'tiny-llama3-Q6_K.gguf'} ..." in err.splitlines()
    trace = ["trace", "-p", "hi", "--n-top", "3", "--json", "--seed", "1"]  # trace too, here from the cache
    assert run_main([*trace, "-hf", f"{LLAMA}:Q8_0", "--offline"], capsys)[:2] == run_main(
        [*trace, "-m", str(MODELS / "llama3-Q8_0.gguf")], capsys)[:2]


def test_serve_takes_hf_and_offline(local_hub, monkeypatch, capsys):
    import samplechain.server.app as app

    hub, cache = local_hub
    got = []
    monkeypatch.setattr(app, "serve", lambda config, log_level="warning": got.append(config) or 0)
    download_model(f"{LLAMA}:Q8_0")
    hub.requests.clear()
    assert main(["serve", "-hf", f"{LLAMA}:Q8_0", "--offline", "--spec-type", "draft-simple", "-hfd",
                 f"{LLAMA}:Q8_0"]) == 0
    path = str(snapshot(hub, cache, LLAMA) / "tiny-llama3-Q8_0.gguf")
    assert (got[0].model, got[0].model_draft, got[0].alias) == (path, path, (f"{LLAMA}:Q8_0",))  # llama-server's name
    assert hub.requests == []
    assert main(["serve", "-hf", f"{LLAMA}:q8_0", "--offline", "--alias", "tiny"]) == 0
    assert (got[1].model, got[1].alias) == (path, ("tiny",))
    capsys.readouterr()
    assert one_line_error(["serve", "-hf", f"{LLAMA}:Q6_K", "--offline"], capsys, "serve") == (
        f"offline mode (HF_HUB_OFFLINE=1, --offline) downloads nothing, and {LLAMA} has no Q6_K GGUF file in the "
        f"hub cache ({cache}) (its cached quants: Q8_0)")


def test_the_command_end_to_end(tmp_path):
    """``samplechain generate -hf`` in a process of its own, its environment pointed at the stand-in hub: the same
    text as ``-m`` with the fixture; a second run, offline, makes no request."""
    want = text(MODELS / "llama3-Q8_0.gguf", "hi", 4)
    with LocalHub({LLAMA: llama_repo()}) as hub:
        env = hub.environ(tmp_path)
        cache = Path(env["HF_HUB_CACHE"])
        command = [sys.executable, "-m", "samplechain", "generate", "-hf", f"{LLAMA}:Q8_0", "-p", "hi", "-n", "4",
                   "--temp", "0", "--no-perf", "--no-display-prompt"]
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert run.stdout == want + "\n"
        path = snapshot(hub, cache, LLAMA) / "tiny-llama3-Q8_0.gguf"
        assert run.stderr.splitlines()[:2] == [
            f"hf: {LLAMA}:Q8_0 -> tiny-llama3-Q8_0.gguf: downloading from {hub.url} into {cache}",
            f"loading model {path} ..."]
        assert hub.downloads() == [f"/{LLAMA}/resolve/{hub.sha(LLAMA)}/tiny-llama3-Q8_0.gguf"]
        hub.requests.clear()
        run = subprocess.run(command, env={**env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and run.stdout == want + "\n" and hub.requests == []
        assert run.stderr.splitlines()[0] == f"hf: {LLAMA}:Q8_0 -> tiny-llama3-Q8_0.gguf: in the cache (offline)"


def test_huggingface_hub_is_imported_only_to_download():
    code = ("import sys; from samplechain.runtime import hub; from samplechain import cli; "
            "cli.build_parser().parse_args(['generate', '-hf', 'a/b']); print('huggingface_hub' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.stdout == "False\n", run.stderr
