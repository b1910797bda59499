"""GGUF models from the Hugging Face hub: llama.cpp's ``-hf USER/REPO[:QUANT]``, on ``huggingface_hub``'s client.

The file is chosen as llama.cpp chooses it (``common/download.cpp``): with ``-hff FILE`` that file; else the first GGUF
model file whose path matches the quant tag (``QUANT`` followed by ``.`` or ``-``, case-insensitive); without a tag
Q4_K_M, then Q8_0, then the repo's first GGUF model file. Projector, importance-matrix and draft-head files (``mmproj``,
``imatrix``, ``mtp-``, ``eagle3-``, ``dflash-``, ``dspark-``) are never the model. A split model
(``name-00001-of-0000N.gguf``) is downloaded whole and its first part returned (``gguf.py`` loads the others from
next to it). The file names' rules and the cache are ``runtime/hub_cache.py``'s (its names are here too).

Downloads go through ``huggingface_hub`` (its ``hf_hub_download``: the cache layout, locks, resumed downloads, tqdm
progress bars on stderr), pinned to the commit ``main`` pointed at when the repo was listed, with ``refs/main``
recorded as llama.cpp's ``hf_cache::get_repo_commit`` records it. A model already in the cache costs one request (the
listing); offline (``HF_HUB_OFFLINE=1``, or ``offline=True``: ``serve --offline``) none: the choice is made among the
cached snapshot's files, as llama.cpp's ``hf_cache::get_cached_files``. When the hub cannot be reached the cache is
used too, with a note; a model that is not there is a one-line error.

The cache is the hub's own (``hub_cache.cache_dir``: ``$LLAMA_CACHE`` first, as llama.cpp reads it, else
``huggingface_hub``'s choice). The endpoint is ``$MODEL_ENDPOINT`` or ``$HF_ENDPOINT`` (llama.cpp's
``common_get_model_endpoint``), else https://huggingface.co. Both are read at each call, not when
``huggingface_hub`` is imported; ``huggingface_hub`` itself is imported only when something is downloaded.

Also here, for llama-server's router: download progress for its ``download_progress`` events (``download_model``'s
``progress``) and preset repos (``preset_file``: a repo with a ``preset.ini`` at its root, which ``-hf`` serves in
router mode); the removal of a cached model (``remove_cached``: ``DELETE /models``) is ``hub_cache``'s.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import time
from collections.abc import Callable, Sequence

from samplechain.runtime.hub_cache import (
    SplitInfo,
    best_file,
    cache_dir,
    cached_files,
    cached_ref,
    is_model_file,
    repo_folder,
    split_info,
    split_parts,
    split_repo_tag,
    write_ref,
)

__all__ = ["REMOTE_PRESET_KEYS", "Progress", "download_model", "endpoint", "preset_file", "resolve_model_args"]

Progress = Callable[[str, int, int], None]  # (the file's URL, bytes done, bytes in all: 0 when unknown)

DEFAULT_ENDPOINT = "https://huggingface.co"
PRESET = "preset.ini"  # download.cpp: common_download_get_hf_plan, a preset repo's file at its root
REMOTE_PRESET_KEYS = frozenset({
    "model-url", "hf-repo", "hf-repo-draft", "hf-repo-v", "hf-file-v", "mmproj-url", "pooling", "jinja",
    "batch-size", "ubatch-size", "cache-reuse", "chat-template-kwargs", "mmap"})
"""The options a preset from a hub repo may set, as llama.cpp lists them (``common/preset.cpp:
get_remote_preset_whitelist``, for ``common_preset_context``'s ``filter_allowed_keys`` / ``allowed_keys``: its
``load_from_ini`` refuses any other key with "option 'KEY' is not allowed in remote presets"; never an option that
writes files). llama.cpp also allows every sampling option (``common_arg::is_sampling``) and every other name of an
allowed option (its other flags without dashes, its ``LLAMA_ARG_*`` variable); ``version`` is always skipped. Newer
llama.cpp (the one llama-cpp-python 0.3.36 vendors) keeps ``filter_allowed_keys`` but never sets it: its router takes
any key of a remote preset and warns "please only use presets that you can trust"."""


def endpoint() -> str:
    """The hub's address: ``$MODEL_ENDPOINT``, ``$HF_ENDPOINT`` (``common.cpp: common_get_model_endpoint``), else
    https://huggingface.co."""
    return (os.environ.get("MODEL_ENDPOINT") or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _offline_env() -> bool:
    return any(os.environ.get(v, "").strip().upper() in ("1", "ON", "YES", "TRUE")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


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


def _resolve_url(url: str, repo: str, commit: str, path: str) -> str:
    """The file's address on the hub, llama.cpp's key for its download progress (``{endpoint}/{repo}/resolve/{commit}/
    {path}``)."""
    return f"{url}/{repo}/resolve/{commit}/{path}"


def _finished(progress: Progress | None, key: str, path: str, sent: dict[str, tuple[int, int]]) -> None:
    """``progress(key, size, size)`` for a file in the cache, unless its download already ended so."""
    if progress is None:
        return
    size = os.path.getsize(path)
    if sent.get(key) != (size, size):
        sent[key] = (size, size)
        progress(key, size, size)


def _progress_bar(progress: Progress, key: str, sent: dict[str, tuple[int, int]]) -> type:
    """A tqdm class for ``hf_hub_download(tqdm_class=...)`` that draws nothing and hands ``progress(key, done, total)``
    the bytes written (from the resumed size on; ``update_transfer``, the network bytes of a xet download, is not
    counted). ``done`` never goes back (a restarted download is reported again once it passes its old mark)."""
    from huggingface_hub.utils import tqdm

    class Bar(tqdm):  # type: ignore[misc, valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs["disable"] = True  # no bar on the console: the callback shows progress
            super().__init__(*args, **kwargs)
            self.done = int(kwargs.get("initial") or 0)  # type: ignore[call-overload]
            self._report()

        def update(self, n: float | None = 1) -> bool | None:
            self.done += int(n or 0)
            self._report()
            return None

        def update_transfer(self, n: int = 1) -> None:
            pass

        def _report(self) -> None:
            total = max(int(self.total or 0), 0)
            last = sent.get(key)
            if last is None or self.done > last[0] or (self.done == last[0] and total != last[1]):
                sent[key] = (self.done, total)
                progress(key, self.done, total)

    return Bar


def _from_cache(repo: str, tag: str, filename: str | None, label: str, cache: str, why: str, note: str,
                progress: Progress | None = None) -> str:
    """The model from the cached snapshot only, ``why`` (offline, no hub: the start of the error when it is not
    there), ``note`` what is said when it is; each part reported done to ``progress``."""
    files = cached_files(cache, repo).get(repo)
    if not files:
        raise FileNotFoundError(f"{why}, and {label} is not in the hub cache ({cache})")
    try:
        parts = _choose(repo, tag, filename, list(files), f" in the hub cache ({cache})")
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{why}, and {e}") from None
    _say(label, parts, note)
    commit, sent = cached_ref(repo_folder(cache, repo)) or "main", {}
    for part in parts:
        _finished(progress, _resolve_url(endpoint(), repo, commit, part), files[part], sent)
    return files[parts[0]]


class _UseCache(Exception):
    """The hub did not answer (unreachable, a 5xx, a 429): the cache is used. ``why`` begins the error when the file
    is not there, ``note`` is said when it is."""

    def __init__(self, why: str, note: str) -> None:
        super().__init__(why)
        self.why, self.note = why, note


KEEP_S = 60.0  # how long a listing kept by preset_file waits for download_model
_kept: dict[tuple[str, str, str | None], tuple[float, tuple[str, list[str]] | Exception]] = {}


def _ask_hub(repo: str, url: str, token: str | None) -> tuple[str, list[str]] | Exception:
    """(commit, files) of the repo's ``main`` (``HfApi.model_info``, one request; llama.cpp's
    ``hf_cache::get_repo_files``), or the error to raise: ValueError, FileNotFoundError or _UseCache."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        info = HfApi(endpoint=url, token=token).model_info(repo, revision="main", timeout=10)
    except GatedRepoError:
        return ValueError(f"{repo} is a gated repo at {url}: accept its conditions on its page and give a token "
                          f"(-hft/--hf-token or $HF_TOKEN)")
    except RepositoryNotFoundError:
        return FileNotFoundError(f"Hugging Face repo {repo} not found at {url}: check its name; a private or gated "
                                 f"repo needs a token (-hft/--hf-token or $HF_TOKEN)")
    except RevisionNotFoundError:
        return FileNotFoundError(f"Hugging Face repo {repo} has no main branch at {url}")
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", 0) or 0
        if status < 500 and status != 429:
            return ValueError(f"the Hugging Face hub at {url} refused {repo}: {_one_line(e)}")
        return _UseCache(f"the Hugging Face hub at {url} answers {status}",
                         f"the hub answers {status}: the cached copy")
    except _network_errors() as e:
        return _UseCache(_unreachable(url, e), f"cannot reach {url}: the cached copy")
    return str(info.sha), [s.rfilename for s in info.siblings or []]


def _listing(repo: str, url: str, token: str | None, keep: bool = False) -> tuple[str, list[str]]:
    """:func:`_ask_hub`'s answer, raised when an error. ``keep``: the answer (or error) is kept for the next call for
    the same endpoint, repo and token, which then asks nothing if it comes within ``KEEP_S`` seconds: so
    :func:`preset_file` then :func:`download_model` cost one listing, as llama.cpp's one ``common_download_get_hf_plan``
    does."""
    key, now = (url, repo, token), time.monotonic()
    kept = _kept.pop(key, None)
    for old in [k for k, (at, _) in _kept.items() if now - at >= KEEP_S]:  # kept for no one
        _kept.pop(old, None)
    outcome = kept[1] if kept is not None and now - kept[0] < KEEP_S else _ask_hub(repo, url, token)
    if keep:
        _kept[key] = (time.monotonic(), outcome)
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def _fetch(repo: str, path: str, commit: str, cache: str, url: str, token: str | None,
           tqdm_class: type | None = None) -> str:
    """``hf_hub_download`` of one file at ``commit``, its errors in one line (ValueError)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return hf_hub_download(repo, path, revision=commit, cache_dir=cache, endpoint=url, token=token,
                               tqdm_class=tqdm_class)
    except HfHubHTTPError as e:
        raise ValueError(f"downloading {path} of {repo} from {url}: {_one_line(e)}") from None
    except _network_errors() as e:
        raise ValueError(f"downloading {path} of {repo}: {_unreachable(url, e)}") from None
    except OSError as e:
        raise ValueError(f"downloading {path} of {repo} into {cache}: {_one_line(e)}") from None


def _offline(offline: bool | None) -> bool:
    """Only the cache: ``offline``, or ``$HF_HUB_OFFLINE`` now, or as ``huggingface_hub`` read it when imported (which
    imports it, unless one of the first two says so)."""
    if offline or _offline_env():
        return True
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def download_model(repo: str, quant: str | None = None, filename: str | None = None, *, token: str | None = None,
                   offline: bool | None = None, progress: Progress | None = None) -> str:
    """The local path of the GGUF that llama.cpp's ``-hf repo[:quant]`` (``-hff filename``) loads, downloaded into the
    hub cache unless it is there (``arg.cpp: common_models_handler_init/apply``, ``download.cpp:
    common_download_get_hf_plan``); a split model's first part, all parts fetched.

    ``repo``: ``USER/REPO`` or ``USER/REPO:QUANT``; ``quant``: the tag, when not in ``repo``; ``filename``: a file of
    the repo, then the quant is not used. ``token``: for private and gated repos (default: ``$HF_TOKEN`` or the
    token ``huggingface_hub`` has stored). ``offline``: only the cache (default: ``$HF_HUB_OFFLINE``). Says on stderr
    which file it fetches (tqdm bars while downloading); errors are one line (ValueError, FileNotFoundError).

    ``progress``: instead of the tqdm bars, ``progress(url, done, total)`` while each file downloads (``url`` its
    ``{endpoint}/{repo}/resolve/{commit}/{path}``, llama-server's key in its ``download_progress`` events; ``done``
    never goes back; ``total`` 0 when unknown), from the resumed size to ``(size, size)``; a file already in the
    cache gets that last call only."""
    name, tag = split_repo_tag(repo)
    if quant:
        if tag and tag.upper() != quant.upper():
            raise ValueError(f"two quants for {name}: {tag!r} in the repo and quant={quant!r}")
        tag = quant
    label = f"{name}:{tag}" if tag and not filename else (f"{name} {filename}" if filename else name)
    cache = cache_dir()
    if _offline(offline):
        return _from_cache(name, tag, filename, label, cache, _OFFLINE, "in the cache (offline)", progress)
    url = endpoint()
    try:
        commit, files = _listing(name, url, token)
    except _UseCache as e:
        return _from_cache(name, tag, filename, label, cache, e.why, e.note, progress)
    parts = _choose(name, tag, filename, files, "")
    snapshot = os.path.join(repo_folder(cache, name), "snapshots", commit)
    cached = all(os.path.isfile(os.path.join(snapshot, *p.split("/"))) for p in parts)
    _say(label, parts, "in the cache" if cached else f"downloading from {url} into {cache}")
    paths, sent = [], {}
    for part in parts:
        key = _resolve_url(url, name, commit, part)
        bar = _progress_bar(progress, key, sent) if progress is not None else None
        paths.append(_fetch(name, part, commit, cache, url, token, bar))
        _finished(progress, key, paths[-1], sent)
    write_ref(cache, name, commit)
    return paths[0]


def preset_file(repo: str, *, token: str | None = None, offline: bool | None = None) -> str | None:
    """The local path of the repo's ``preset.ini`` (at its root), downloaded into the hub cache like a model file, or
    found in the cached snapshot offline or without the hub; None when the repo has none (a model repo). With one,
    llama.cpp's ``-hf USER/REPO`` serves in router mode with that preset and loads no model (``download.cpp:
    common_download_get_hf_plan``: "if preset.ini exists in the repo root, download only that file"; ``arg.cpp:
    common_models_handler_apply``). ``repo``'s ``:QUANT``, if any, is not used.

    It makes the one listing request :func:`download_model` makes, and keeps it (``KEEP_S`` seconds) for the next
    ``download_model`` of the repo, which then asks nothing: call it first, then ``download_model`` when it gives
    None. The options such a preset may set: :data:`REMOTE_PRESET_KEYS`. Errors as ``download_model``'s."""
    name, _ = split_repo_tag(repo)
    cache = cache_dir()

    def cached() -> str | None:
        return cached_files(cache, name).get(name, {}).get(PRESET)

    if _offline(offline):
        return cached()
    url = endpoint()
    try:
        commit, files = _listing(name, url, token, keep=True)
    except _UseCache as e:
        if (path := cached()) is not None:
            _say(name, [PRESET], e.note)
        return path
    if PRESET not in files:
        return None
    path = os.path.join(repo_folder(cache, name), "snapshots", commit, PRESET)
    _say(name, [PRESET], "in the cache" if os.path.isfile(path) else f"downloading from {url} into {cache}")
    path = _fetch(name, PRESET, commit, cache, url, token)
    write_ref(cache, name, commit)
    return path


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
