"""GGUF models from the Hugging Face hub: llama.cpp's ``-hf USER/REPO[:QUANT]``, on ``huggingface_hub``'s client.

The file is chosen as llama.cpp chooses it (``common/download.cpp``): with ``-hff FILE`` that file; else the first GGUF
model file whose path matches the quant tag (``QUANT`` followed by ``.`` or ``-``, case-insensitive); without a tag
Q4_K_M, then Q8_0, then the repo's first GGUF model file. Projector, importance-matrix and draft-head files (``mmproj``,
``imatrix``, ``mtp-``, ``eagle3-``, ``dflash-``, ``dspark-``) are never the model. A split model
(``name-00001-of-0000N.gguf``) is downloaded whole and its first part returned (``gguf.py`` loads the others from
next to it).

Downloads go through ``huggingface_hub`` (its ``hf_hub_download``: the cache layout, locks, resumed downloads, tqdm
progress bars on stderr), pinned to the commit ``main`` pointed at when the repo was listed, with ``refs/main``
recorded as llama.cpp's ``hf_cache::get_repo_commit`` records it. A model already in the cache costs one request (the
listing); offline (``HF_HUB_OFFLINE=1``, or ``offline=True``: ``serve --offline``) none: the choice is made among the
cached snapshot's files, as llama.cpp's ``hf_cache::get_cached_files``. When the hub cannot be reached the cache is
used too, with a note; a model that is not there is a one-line error.

The cache is the hub's own, shared with llama.cpp and every ``huggingface_hub`` user: its folder is chosen as
llama.cpp's ``common/hf-cache.cpp: get_cache_directory`` chooses it, ``$LLAMA_CACHE`` first (llama.cpp honours it
before the hub's variables; where it is unset, as usual, this is exactly ``huggingface_hub``'s own choice), then
``$HF_HUB_CACHE``, ``$HUGGINGFACE_HUB_CACHE``, ``$HF_HOME/hub``, ``$XDG_CACHE_HOME/huggingface/hub``,
``~/.cache/huggingface/hub``. The endpoint is ``$MODEL_ENDPOINT`` or ``$HF_ENDPOINT`` (llama.cpp's
``common_get_model_endpoint``), else https://huggingface.co. Both are read at each call, not when
``huggingface_hub`` is imported; ``huggingface_hub`` itself is imported only when something is downloaded.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["CachedModel", "SplitInfo", "best_file", "cache_dir", "cached_models", "download_model", "endpoint",
           "is_model_file", "resolve_model_args", "split_info", "split_parts", "split_repo_tag"]

DEFAULT_ENDPOINT = "https://huggingface.co"
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
    if not _valid_repo(repo):
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


def endpoint() -> str:
    """The hub's address: ``$MODEL_ENDPOINT``, ``$HF_ENDPOINT`` (``common.cpp: common_get_model_endpoint``), else
    https://huggingface.co."""
    return (os.environ.get("MODEL_ENDPOINT") or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _offline_env() -> bool:
    return any(os.environ.get(v, "").strip().upper() in ("1", "ON", "YES", "TRUE")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _valid_repo(repo: str) -> bool:
    return len(repo) <= 256 and repo.count("/") == 1 and _REPO.match(repo) is not None


def _repo_folder(cache: str, repo: str) -> str:
    return os.path.join(cache, "models--" + repo.replace("/", "--"))


def _cached_ref(folder: str) -> str | None:
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


def _cached_files(cache: str, repo: str | None = None) -> dict[str, dict[str, str]]:
    """repo -> {path in the repo: local path} for the snapshots in the cache (``hf-cache.cpp: get_cached_files``):
    each repo's snapshot of its cached ref, its files that exist (a broken link is no file), in path order."""
    out: dict[str, dict[str, str]] = {}
    if not os.path.isdir(cache):
        return out
    for entry in sorted(os.listdir(cache)):
        if not entry.startswith("models--"):
            continue
        name = entry[len("models--"):].replace("--", "/")
        if not _valid_repo(name) or (repo is not None and name != repo):
            continue
        folder = os.path.join(cache, entry)
        commit = _cached_ref(folder)
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
    for repo, files in _cached_files(cache).items():
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


def _quants(files: Sequence[str]) -> str:
    """The quants a repo offers, for an error: each model file's tag (its name when it has none), once."""
    seen: dict[str, None] = {}
    for f in files:
        info = split_info(f)
        if info is not None and is_model_file(f) and info.index == 1:
            seen.setdefault(info.tag or f, None)
    return ", ".join(seen) or "none"


def _choose(repo: str, tag: str, filename: str | None, files: Sequence[str], where: str) -> list[str]:
    """The repo files to fetch for the model: its parts, the first one the model's path."""
    its = "its cached" if where else "its"
    if filename:
        if filename not in files:
            ggufs = ", ".join(f for f in files if f.endswith(".gguf")) or "none"
            raise FileNotFoundError(f"{repo} has no file {filename!r}{where} ({its} GGUF files: {ggufs})")
        primary = filename
    else:
        primary = best_file(files, tag)
        if primary is None:
            if tag:
                raise FileNotFoundError(f"{repo} has no {tag} GGUF file{where} ({its} quants: {_quants(files)})")
            raise FileNotFoundError(f"{repo} has no GGUF model file{where}")
    parts = split_parts(files, primary)
    count = (split_info(primary) or SplitInfo("", "", 1, 1)).count
    if len(parts) != max(count, 1):
        raise FileNotFoundError(f"{repo}: {primary} is part of a split model of {count} files, {len(parts)} of "
                                f"them{where}")
    return parts


def _say(label: str, parts: Sequence[str], what: str) -> None:
    more = f" (+{len(parts) - 1} more part{'s' if len(parts) > 2 else ''})" if len(parts) > 1 else ""
    print(f"hf: {label} -> {parts[0]}{more}: {what}", file=sys.stderr, flush=True)


def _network_errors() -> tuple[type[BaseException], ...]:
    """What ``huggingface_hub`` raises when the hub cannot be reached: its HTTP library's transport errors (httpx2,
    httpx or requests, by version) and ``OfflineModeIsEnabled``."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module, name in (("httpx2", "TransportError"), ("httpx", "TransportError"), ("requests", "ConnectionError"),
                         ("requests", "Timeout")):
        try:
            errors.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


_OFFLINE = "offline mode (HF_HUB_OFFLINE=1, --offline) downloads nothing"


def _unreachable(url: str, error: BaseException) -> str:
    return (f"cannot reach the Hugging Face hub at {url} (no network? {_one_line(error)}; HF_HUB_OFFLINE=1 uses "
            f"the models already in the hub cache without a network)")


def _one_line(error: BaseException) -> str:
    """The error in a few words: its type and message on one line (a socket error's ``[Errno N] ...`` alone, where
    an HTTP library wraps it in layers of repr)."""
    text = " ".join(str(error).split())
    errno = re.search(r"\[Errno -?\d+\][^\"'()\[\]]*", text)
    if errno:
        text = errno.group(0).strip()
    elif len(text) > 200:
        text = text[:200] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _from_cache(repo: str, tag: str, filename: str | None, label: str, cache: str, why: str, note: str) -> str:
    """The model from the cached snapshot only, ``why`` (offline, no hub: the start of the error when it is not
    there), ``note`` what is said when it is."""
    files = _cached_files(cache, repo).get(repo)
    if not files:
        raise FileNotFoundError(f"{why}, and {label} is not in the hub cache ({cache})")
    try:
        parts = _choose(repo, tag, filename, list(files), f" in the hub cache ({cache})")
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{why}, and {e}") from None
    _say(label, parts, note)
    return files[parts[0]]


def _write_ref(cache: str, repo: str, commit: str) -> None:
    """``refs/main`` = ``commit``, as ``hf_cache::get_repo_commit`` (and ``huggingface_hub``) record it: an offline
    run then finds the snapshot."""
    path = os.path.join(_repo_folder(cache, repo), "refs", "main")
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


def download_model(repo: str, quant: str | None = None, filename: str | None = None, *, token: str | None = None,
                   offline: bool | None = None) -> str:
    """The local path of the GGUF that llama.cpp's ``-hf repo[:quant]`` (``-hff filename``) loads, downloaded into the
    hub cache unless it is there (``arg.cpp: common_models_handler_init/apply``, ``download.cpp:
    common_download_get_hf_plan``); a split model's first part, all parts fetched.

    ``repo``: ``USER/REPO`` or ``USER/REPO:QUANT``; ``quant``: the tag, when not in ``repo``; ``filename``: a file of
    the repo, then the quant is not used. ``token``: for private and gated repos (default: ``$HF_TOKEN`` or the
    token ``huggingface_hub`` has stored). ``offline``: only the cache (default: ``$HF_HUB_OFFLINE``). Says on stderr
    which file it fetches (tqdm bars while downloading); errors are one line (ValueError, FileNotFoundError)."""
    name, tag = split_repo_tag(repo)
    if quant:
        if tag and tag.upper() != quant.upper():
            raise ValueError(f"two quants for {name}: {tag!r} in the repo and quant={quant!r}")
        tag = quant
    label = f"{name}:{tag}" if tag and not filename else (f"{name} {filename}" if filename else name)
    cache = cache_dir()
    offline = _offline_env() if offline is None else (offline or _offline_env())
    if offline:
        return _from_cache(name, tag, filename, label, cache, _OFFLINE, "in the cache (offline)")

    from huggingface_hub import HfApi, constants, hf_hub_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    if constants.HF_HUB_OFFLINE:  # set in the environment before huggingface_hub was imported
        return _from_cache(name, tag, filename, label, cache, _OFFLINE, "in the cache (offline)")
    url = endpoint()
    try:
        info = HfApi(endpoint=url, token=token).model_info(name, revision="main", timeout=10)
    except GatedRepoError:
        raise ValueError(f"{name} is a gated repo at {url}: accept its conditions on its page and give a token "
                         f"(-hft/--hf-token or $HF_TOKEN)") from None
    except RepositoryNotFoundError:
        raise FileNotFoundError(f"Hugging Face repo {name} not found at {url}: check its name; a private or gated "
                                f"repo needs a token (-hft/--hf-token or $HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise FileNotFoundError(f"Hugging Face repo {name} has no main branch at {url}") from None
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", 0) or 0
        if status < 500 and status != 429:
            raise ValueError(f"the Hugging Face hub at {url} refused {name}: {_one_line(e)}") from None
        return _from_cache(name, tag, filename, label, cache, f"the Hugging Face hub at {url} answers {status}",
                           f"the hub answers {status}: the cached copy")
    except _network_errors() as e:
        return _from_cache(name, tag, filename, label, cache, _unreachable(url, e),
                           f"cannot reach {url}: the cached copy")
    files = [s.rfilename for s in info.siblings or []]
    parts = _choose(name, tag, filename, files, "")
    snapshot = os.path.join(_repo_folder(cache, name), "snapshots", str(info.sha))
    cached = all(os.path.isfile(os.path.join(snapshot, *p.split("/"))) for p in parts)
    _say(label, parts, "in the cache" if cached else f"downloading from {url} into {cache}")
    paths = []
    for part in parts:
        try:
            paths.append(hf_hub_download(name, part, revision=info.sha, cache_dir=cache, endpoint=url, token=token))
        except HfHubHTTPError as e:
            raise ValueError(f"downloading {part} of {name} from {url}: {_one_line(e)}") from None
        except _network_errors() as e:
            raise ValueError(f"downloading {part} of {name}: {_unreachable(url, e)}") from None
        except OSError as e:
            raise ValueError(f"downloading {part} of {name} into {cache}: {_one_line(e)}") from None
    _write_ref(cache, name, str(info.sha))
    return paths[0]


def resolve_model_args(args: argparse.Namespace) -> None:
    """The CLI's ``-hf`` / ``-hff`` / ``-hft`` / ``-hfd`` (and ``--offline``), as llama.cpp's ``common_models_handler``
    applies them: ``args.model`` becomes the local path of the model ``-hf`` names (``-m`` is then not used, as in
    llama.cpp), ``args.model_draft`` that of ``-hfd``'s (where ``-md``, if given, names the draft repo's file, as
    llama.cpp's ``--spec-draft-model`` sets the draft's ``hf_file``). ``serve``'s ``--alias`` defaults to the ``-hf``
    value, which is the model's name in llama-server. Nothing happens without these flags."""
    repo, filename = getattr(args, "hf_repo", None), getattr(args, "hf_file", None)
    draft = getattr(args, "hf_repo_draft", None)
    token = getattr(args, "hf_token", None) or None
    offline = bool(getattr(args, "offline", False)) or None
    if filename and not repo:
        raise ValueError("-hff/--hf-file names a file of the -hf/--hf-repo repo: give -hf too")
    if repo:
        if getattr(args, "model", None) is not None:
            print(f"note: -m {args.model} is not used: the model is {repo}'s (-hf)", file=sys.stderr)
        args.model = download_model(repo, filename=filename, token=token, offline=offline)
        if hasattr(args, "alias") and args.alias is None:
            args.alias = repo
    if draft:
        args.model_draft = download_model(draft, filename=getattr(args, "model_draft", None), token=token,
                                          offline=offline)
