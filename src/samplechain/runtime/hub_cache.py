"""The Hugging Face hub cache as llama.cpp reads it, and GGUF file names as llama.cpp reads them: what ``-hf`` chooses
among a repo's files (``runtime/hub.py`` downloads it), the models the cache holds (``cached_models``, llama-server's
router's list) and their removal (``remove_cached``, its ``DELETE /models``). No network, no ``huggingface_hub``.

The cache is the hub's own, shared with llama.cpp and every ``huggingface_hub`` user: its folder is chosen as
llama.cpp's ``common/hf-cache.cpp: get_cache_directory`` chooses it, ``$LLAMA_CACHE`` first (llama.cpp honours it
before the hub's variables; where it is unset, as usual, this is exactly ``huggingface_hub``'s own choice), then
``$HF_HUB_CACHE``, ``$HUGGINGFACE_HUB_CACHE``, ``$HF_HOME/hub``, ``$XDG_CACHE_HOME/huggingface/hub``,
``~/.cache/huggingface/hub``, read at each call. Its layout is ``huggingface_hub``'s: ``models--USER--REPO/`` with
``refs/main`` (the commit), ``snapshots/COMMIT/PATH`` (links) and ``blobs/`` (the files).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["CachedModel", "SplitInfo", "best_file", "cache_dir", "cached_files", "cached_models", "cached_ref",
           "is_model_file", "remove_cached", "repo_folder", "split_info", "split_parts", "split_repo_tag",
           "valid_repo", "write_ref"]

DEFAULT_TAGS = ("Q4_K_M", "Q8_0")  # download.cpp: find_best_model's choice without a tag, in order
NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")  # gguf_filename_is_model
NOT_LISTED = ("mmproj", "mtp-", "eagle3-", "dflash-", "dspark-")  # common_list_cached_models' exclusions
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
_COMMIT = re.compile(r"^[0-9a-fA-F]{40}$")
_REPO = re.compile(r"^[A-Za-z0-9_]+(?:[./-][A-Za-z0-9_]+)*$")  # hf-cache.cpp: is_valid_repo_id, less the one '/'


@dataclass(frozen=True)
class SplitInfo:
    """What a GGUF file name says (``download.cpp: get_gguf_split_info``): ``prefix``, the name without ``.gguf`` and
    the split suffix; ``tag``, the quant at its end in upper case (``Q4_K_M``; "" when none); ``index`` and ``count``
    of a split model's part (1 and 1 for a whole file)."""

    prefix: str
    tag: str
    index: int
    count: int


@dataclass(frozen=True)
class CachedModel:
    """A GGUF model in the hub cache, as llama.cpp's router lists it (``common_list_cached_models``).

    ``id``: ``USER/REPO:QUANT``, what ``-hf`` takes to load it; ``repo`` and ``quant`` its two halves; ``filename``
    the file's path in the repo and ``path`` its local path (a split model's: the first part's)."""

    id: str
    repo: str
    quant: str
    filename: str
    path: str


def split_info(path: str) -> SplitInfo | None:
    """The name's prefix, quant tag and split position (``download.cpp: get_gguf_split_info``); None for a path that
    does not end in ``.gguf``. ``tiny-Q4_K_M-00001-of-00002.gguf``: ("tiny-Q4_K_M", "Q4_K_M", 1, 2)."""
    if not path.endswith(".gguf"):
        return None
    prefix, index, count = path[:-len(".gguf")], 1, 1
    split = _SPLIT.match(prefix)
    if split:
        prefix, index, count = split.group(1), int(split.group(2)), int(split.group(3))
    tag = _TAG.search(prefix)
    return SplitInfo(prefix, tag.group(1).upper() if tag else "", index, count)


def split_repo_tag(hf_repo: str) -> tuple[str, str]:
    """``USER/REPO[:QUANT]`` -> (``USER/REPO``, ``QUANT`` or "") (``download.cpp: common_download_split_repo_tag``)."""
    repo, _, tag = hf_repo.partition(":")
    tag = tag.rsplit(":", 1)[-1]  # llama.cpp takes the last ':'-separated field as the tag
    if not valid_repo(repo):
        raise ValueError(f"invalid Hugging Face repo {hf_repo!r}: expected <user>/<model>[:quant]")
    return repo, tag


def is_model_file(path: str) -> bool:
    """A GGUF that can be the model (``download.cpp: gguf_filename_is_model``): no projector, importance matrix or
    draft head in its file name."""
    name = path.rsplit("/", 1)[-1]
    return path.endswith(".gguf") and not any(word in name for word in NOT_MODELS)


def best_file(files: Sequence[str], tag: str = "") -> str | None:
    """The model file ``-hf repo[:tag]`` loads among a repo's ``files`` (``download.cpp: find_best_model``): the first
    model file whose path has ``tag`` followed by ``.`` or ``-`` (case-insensitive), a split model's first part only;
    without a tag Q4_K_M, then Q8_0, then the first model file. None when there is none."""
    def first_parts(candidates: Sequence[str]) -> list[str]:
        out = []
        for f in candidates:
            info = split_info(f)
            if is_model_file(f) and info is not None and (info.count <= 1 or info.index == 1):
                out.append(f)
        return out

    models = first_parts(files)
    for t in ([tag] if tag else DEFAULT_TAGS):
        pattern = re.compile(re.escape(t) + "[.-]", re.IGNORECASE)
        for f in models:
            if pattern.search(f):
                return f
    return models[0] if models and not tag else None


def split_parts(files: Sequence[str], primary: str) -> list[str]:
    """Every part of ``primary``'s split model among ``files``, in order (``download.cpp: get_split_files``);
    ``[primary]`` for a whole file."""
    info = split_info(primary)
    if info is None or info.count <= 1:
        return [primary]
    parts = {}
    for f in files:
        other = split_info(f)
        if other is not None and other.count == info.count and other.prefix == info.prefix:
            parts[other.index] = f
    return [parts[i] for i in sorted(parts)]


def cache_dir() -> str:
    """The hub cache folder, as llama.cpp's ``hf-cache.cpp: get_cache_directory`` chooses it (see the module's
    docstring): ``$LLAMA_CACHE``, else ``huggingface_hub``'s own choice."""
    for var, sub in (("LLAMA_CACHE", ()), ("HF_HUB_CACHE", ()), ("HUGGINGFACE_HUB_CACHE", ()), ("HF_HOME", ("hub",)),
                     ("XDG_CACHE_HOME", ("huggingface", "hub"))):
        base = os.environ.get(var)
        if base:
            return os.path.join(os.path.expanduser(base), *sub)
    return os.path.join(os.path.expanduser("~"), ".cache", "huggingface", "hub")


def valid_repo(repo: str) -> bool:
    return len(repo) <= 256 and repo.count("/") == 1 and _REPO.match(repo) is not None


def repo_folder(cache: str, repo: str) -> str:
    return os.path.join(cache, "models--" + repo.replace("/", "--"))


def cached_ref(folder: str) -> str | None:
    """The commit of the repo's cached snapshot: ``refs/main``, else the first other branch recorded
    (``hf-cache.cpp: get_cached_ref``)."""
    refs = os.path.join(folder, "refs")
    names = sorted(n for n in os.listdir(refs) if os.path.isfile(os.path.join(refs, n))) if os.path.isdir(refs) else []
    for name in sorted(names, key=lambda n: n != "main"):
        with open(os.path.join(refs, name), encoding="utf-8") as f:
            commit = f.read().strip()
        if _COMMIT.match(commit):
            return commit
    return None


def cached_files(cache: str, repo: str | None = None) -> dict[str, dict[str, str]]:
    """repo -> {path in the repo: local path} for the snapshots in the cache (``hf-cache.cpp: get_cached_files``):
    each repo's snapshot of its cached ref, its files that exist (a broken link is no file), in path order."""
    out: dict[str, dict[str, str]] = {}
    if not os.path.isdir(cache):
        return out
    for entry in sorted(os.listdir(cache)):
        if not entry.startswith("models--"):
            continue
        name = entry[len("models--"):].replace("--", "/")
        if not valid_repo(name) or (repo is not None and name != repo):
            continue
        folder = os.path.join(cache, entry)
        commit = cached_ref(folder)
        snapshot = os.path.join(folder, "snapshots", commit or "")
        if commit is None or not os.path.isdir(snapshot):
            continue
        files = {}
        for root, dirs, names in os.walk(snapshot):
            dirs.sort()
            for n in sorted(names):
                local = os.path.join(root, n)
                if os.path.isfile(local):
                    files[os.path.relpath(local, snapshot).replace(os.sep, "/")] = local
        out[name] = dict(sorted(files.items()))
    return out


def cached_models(cache: str | None = None) -> list[CachedModel]:
    """The GGUF models in the hub cache (default: :func:`cache_dir`), as llama.cpp's router lists them
    (``download.cpp: common_list_cached_models``), sorted by repo then file.

    Each repo's cached snapshot (``refs/main``, else another cached branch) is read; a GGUF file whose name ends in a
    quant tag (:func:`split_info`: ``-`` or ``.`` then letters, digits and ``_`` before ``.gguf`` or the split suffix,
    upper-cased: ``tinygemma3-Q8_0.gguf`` -> ``Q8_0``, ``ggml-model-f16.gguf`` -> ``F16``) gives the id
    ``USER/REPO:TAG``, once per repo and tag; a file without one (``stories260K.gguf``), a later part of a split model,
    and projector or draft-head files (``mmproj``, ``mtp-``, ``eagle3-``, ``dflash-``, ``dspark-``) give none. The
    path is what ``-hf USER/REPO:TAG`` resolves to offline (:func:`best_file`); a split model is listed only when all
    its parts are cached."""
    cache = cache_dir() if cache is None else os.fspath(cache)
    out = []
    for repo, files in cached_files(cache).items():
        seen = set()
        for path in files:
            info = split_info(path)
            if info is None or info.index != 1 or not info.tag or info.tag in seen \
                    or any(word in info.prefix for word in NOT_LISTED):
                continue
            seen.add(info.tag)
            primary = best_file(list(files), info.tag)
            if primary is None:
                continue
            parts = split_parts(list(files), primary)
            if len(parts) != (split_info(primary) or info).count:
                continue
            out.append(CachedModel(f"{repo}:{info.tag}", repo, info.tag, primary, files[primary]))
    return out


def write_ref(cache: str, repo: str, commit: str) -> None:
    """``refs/main`` = ``commit``, as ``hf_cache::get_repo_commit`` (and ``huggingface_hub``) record it: an offline
    run then finds the snapshot."""
    path = os.path.join(repo_folder(cache, repo), "refs", "main")
    try:
        with open(path, encoding="utf-8") as f:
            if f.read().strip() == commit:
                return
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(commit)
    os.replace(tmp, path)


def _links(folder: str) -> dict[str, str]:
    """Each entry of the repo's snapshots (all of them) -> the blob it points to (itself when it is a file, not a
    link), in path order."""
    out = {}
    for root, dirs, names in os.walk(os.path.join(folder, "snapshots")):
        dirs.sort()
        for n in sorted(names):
            entry = os.path.join(root, n)
            out[entry] = os.path.normpath(os.path.join(root, os.readlink(entry))) if os.path.islink(entry) else entry
    return out


def remove_cached(model_id: str, cache: str | None = None) -> list[str]:
    """Removes a model from the hub cache (default: :func:`cache_dir`), as llama-server's router removes a cached model
    (``DELETE /models?model=...``; ``download.cpp: common_download_remove``), and returns the paths removed.
    ``model_id``: as :func:`cached_models` names it, ``USER/REPO:QUANT`` (the quant in any case).

    The snapshot entries of the repo's GGUF files whose quant tag (:func:`split_info`) is ``QUANT`` go (all parts of a
    split model; as in llama.cpp, a projector of that tag too; in every snapshot of the repo, where llama.cpp looks at
    the cached one only), then the blobs they pointed to that no other entry points to, then subfolders left empty;
    the repo's other quants stay. When no file of the repo remains, its whole folder goes (the last path returned).
    FileNotFoundError (one line) when ``model_id`` is not a cached model."""
    cache = cache_dir() if cache is None else os.fspath(cache)
    try:
        repo, tag = split_repo_tag(model_id)
    except ValueError:
        repo, tag = model_id, ""
    tag = tag.upper()
    if not tag or not any(m.repo == repo and m.quant == tag for m in cached_models(cache)):
        raise FileNotFoundError(f"{model_id} is not a model in the hub cache ({cache})")
    folder = repo_folder(cache, repo)
    links = _links(folder)
    gone = [e for e in links if getattr(split_info(os.path.basename(e)), "tag", None) == tag]
    for entry in gone:
        os.remove(entry)
    kept = {links[e] for e in links if e not in gone}
    blobs = sorted({links[e] for e in gone if links[e] != e and links[e] not in kept and os.path.isfile(links[e])})
    for blob in blobs:
        os.remove(blob)
    if not kept:
        shutil.rmtree(folder)
        return [*gone, *blobs, folder]
    snapshots = os.path.join(folder, "snapshots")
    for root, _, _ in sorted(os.walk(snapshots), key=lambda walk: -len(walk[0])):
        if os.sep in os.path.relpath(root, snapshots) and not os.listdir(root):
            os.rmdir(root)  # a folder in a snapshot, left empty (never a snapshot itself)
    return [*gone, *blobs]
