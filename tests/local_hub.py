"""A stand-in for the Hugging Face hub on 127.0.0.1: the few endpoints ``huggingface_hub`` calls to list a model
repo and download its files, serving fake repos built from local files (the fixture GGUFs).

    with LocalHub({"test-org/tiny-GGUF": {"tiny-Q8_0.gguf": Path("tests/fixtures/models/llama3-Q8_0.gguf")}}) as hub:
        env = hub.environ(tmp_path)   # HF_ENDPOINT -> the stand-in, the hub cache under tmp_path
        ...                           # run `samplechain generate -hf test-org/tiny-GGUF:Q8_0 ...` with env
        hub.requests                  # [("GET", "/api/models/test-org/tiny-GGUF/revision/main"), ("HEAD", ...), ...]

Endpoints, as the real hub answers them (read from huggingface_hub's ``hf_api.py``, ``file_download.py`` and
``utils/_http.py``; llama.cpp's ``common/hf-cache.cpp`` uses the ``refs`` and ``tree`` ones):

* ``GET /api/models/{repo}[/revision/{rev}]``: the model info, ``sha`` (the commit) and ``siblings`` (the files);
* ``GET /api/models/{repo}/tree/{rev}[?recursive=true]``: the files with ``oid``, ``size`` and ``lfs`` (sha256);
* ``GET /api/models/{repo}/refs``: the ``main`` branch and its ``targetCommit``;
* ``HEAD`` / ``GET /{repo}/resolve/{rev}/{path}``: the file, with ``X-Repo-Commit``, ``ETag`` and ``X-Linked-Etag``
  (the sha256, as for an LFS file), ``X-Linked-Size``, ``Content-Length``, ``Accept-Ranges: bytes``; a ``Range:
  bytes=N-`` request gets ``206`` and the rest of the file (huggingface_hub resumes downloads so).

Errors carry the hub's ``X-Error-Code``: a repo that does not exist (or a private one without its token) is ``404
RepoNotFound`` (huggingface_hub raises ``RepositoryNotFoundError``), a missing file ``404 EntryNotFound``, a revision
other than ``main`` or the commit ``404 RevisionNotFound``. Every request is recorded in ``requests`` as (method,
path without the query), so a test can check that a second run downloads nothing. Also here: ``split_gguf``, which
writes a GGUF as llama.cpp's ``gguf-split`` does, for repos holding a split model.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = ["LocalHub", "split_gguf"]


class _Repo:
    def __init__(self, name: str, files: Mapping[str, Path | bytes], token: str | None) -> None:
        self.name, self.token = name, token
        self.files = {path: (data if isinstance(data, bytes) else Path(data).read_bytes())
                      for path, data in sorted(files.items())}  # the hub lists a tree in path order
        digest = hashlib.sha1(name.encode())
        for path, data in self.files.items():
            digest.update(path.encode() + b"\0" + hashlib.sha256(data).digest())
        self.sha = digest.hexdigest()  # the commit: 40 hex digits, as git's
        self.sha256 = {path: hashlib.sha256(data).hexdigest() for path, data in self.files.items()}
        self.oid = {path: hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
                    for path, data in self.files.items()}


class LocalHub:
    """Fake hub repos served on ``127.0.0.1`` (a free port), for ``huggingface_hub`` pointed at ``url``.

    ``repos``: repo id (``user/name``) -> {path in the repo: a local file or its bytes}. ``private``: repo id -> the
    token (``Authorization: Bearer ...``) it needs; without it the repo is not found, as on the real hub. Use it as
    a context manager (or ``start()`` / ``close()``); ``requests`` lists (method, path) of every request served.
    """

    def __init__(self, repos: Mapping[str, Mapping[str, Path | bytes]],
                 private: Mapping[str, str] | None = None) -> None:
        private = dict(private or {})
        self.repos = {name: _Repo(name, files, private.get(name)) for name, files in repos.items()}
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def add(self, repo: str, files: Mapping[str, Path | bytes], token: str | None = None) -> None:
        """Another repo (also while serving); ``token``: a private one's."""
        self.repos[repo] = _Repo(repo, files, token)

    @property
    def url(self) -> str:
        assert self._server is not None, "the hub is not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def sha(self, repo: str) -> str:
        """The commit id the repo's ``main`` points at."""
        return self.repos[repo].sha

    def downloads(self) -> list[str]:
        """The paths of the file bodies served so far (``GET .../resolve/...``)."""
        with self._lock:
            return [path for method, path in self.requests if method == "GET" and "/resolve/" in path]

    def environ(self, cache: str | os.PathLike[str], base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with ``HF_ENDPOINT`` set to this hub and the hub cache
        (``HF_HOME``, ``HF_HUB_CACHE``) under ``cache``; variables that would point elsewhere are removed."""
        env = dict(os.environ if base is None else base)
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "LLAMA_CACHE", "MODEL_ENDPOINT",
                     "HUGGINGFACE_HUB_CACHE", "HF_HUB_DISABLE_PROGRESS_BARS"):
            env.pop(name, None)
        env.update(HF_ENDPOINT=self.url, HF_HOME=os.fspath(Path(cache) / "hf"),
                   HF_HUB_CACHE=os.fspath(Path(cache) / "hf" / "hub"))
        return env

    def repo_requests(self) -> list[tuple[str, str]]:
        """``requests`` less huggingface_hub's fetch of its agent registry (once a day per ``HF_HOME``)."""
        with self._lock:
            return [r for r in self.requests if r[1] != "/api/agent-harnesses"]

    def patch(self, monkeypatch: object, cache: str | os.PathLike[str]) -> Path:
        """For a test in this process: :meth:`environ`'s variables set with ``monkeypatch`` (pytest's), and the
        values ``huggingface_hub`` read from them when it was imported (``constants``: the endpoint, offline mode,
        the cache and token paths) patched to match, so nothing goes to huggingface.co or to the user's own cache.
        Returns the hub cache folder."""
        env = self.environ(cache, base={})
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "LLAMA_CACHE", "MODEL_ENDPOINT",
                     "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
            monkeypatch.delenv(name, raising=False)  # type: ignore[attr-defined]
        for name, value in env.items():
            monkeypatch.setenv(name, value)  # type: ignore[attr-defined]
        from huggingface_hub import constants

        home = env["HF_HOME"]
        for name, value in (("ENDPOINT", self.url),  # with the URL template made of it at import
                            ("HUGGINGFACE_CO_URL_TEMPLATE", self.url + "/{repo_id}/resolve/{revision}/{filename}"),
                            ("HF_HUB_OFFLINE", False), ("HF_HOME", home),
                            ("HF_HUB_CACHE", env["HF_HUB_CACHE"]), ("HF_TOKEN_PATH", os.path.join(home, "token")),
                            ("HF_STORED_TOKENS_PATH", os.path.join(home, "stored_tokens")),
                            ("AGENT_HARNESSES_PATH", os.path.join(home, ".agent_harnesses.json"))):
            monkeypatch.setattr(constants, name, value, raising=False)  # type: ignore[attr-defined]
        return Path(env["HF_HUB_CACHE"])

    def start(self) -> LocalHub:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="local-hub", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> LocalHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _record(self, method: str, path: str) -> None:
        with self._lock:
            self.requests.append((method, path))


class _Handler(BaseHTTPRequestHandler):
    hub: LocalHub
    server_version = "local-hub"

    def log_message(self, format: str, *args: object) -> None:  # quiet: tests read the requests list
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    # --- routing --------------------------------------------------------------------------------------

    def _answer(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.hub._record(self.command, path)
        if path == "/api/agent-harnesses":  # huggingface_hub's user-agent registry, fetched once a day: none
            return self._json({"standardEnvVars": [], "harnesses": {}}, body)
        if path.startswith("/api/models/"):
            return self._api(path[len("/api/models/"):], body)
        parts = path.lstrip("/").split("/")
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._file(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), body)
        self._error(404, "NotFound", "Not Found", body)

    def _repo(self, name: str, body: bool) -> _Repo | None:
        repo = self.hub.repos.get(name)
        if repo is not None and repo.token is not None \
                and self.headers.get("Authorization") != f"Bearer {repo.token}":
            repo = None
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found", body)
        return repo

    def _revision(self, repo: _Repo, revision: str, body: bool) -> bool:
        if revision in ("main", repo.sha):
            return True
        self._error(404, "RevisionNotFound", "Invalid rev id: " + revision, body)
        return False

    def _api(self, rest: str, body: bool) -> None:
        parts = rest.split("/")
        repo = self._repo("/".join(parts[:2]), body)
        if repo is None:
            return
        what, args = (parts[2], parts[3:]) if len(parts) > 2 else ("revision", ["main"])
        if what == "refs":
            return self._json({"branches": [{"name": "main", "ref": "refs/heads/main", "targetCommit": repo.sha}],
                               "tags": [], "converts": []}, body)
        if what not in ("revision", "tree") or not args:
            return self._error(404, "NotFound", "Not Found", body)
        if not self._revision(repo, args[0], body):
            return None
        if what == "revision":
            return self._json({"_id": repo.sha[:24], "id": repo.name, "modelId": repo.name, "sha": repo.sha,
                               "private": repo.token is not None, "gated": False, "disabled": False,
                               "tags": ["gguf"], "library_name": "gguf",
                               "siblings": [{"rfilename": path} for path in repo.files]}, body)
        folder = "/".join(args[1:])
        recursive = "recursive=true" in (urlsplit(self.path).query or "").lower()
        entries, folders = [], set()
        for path, data in repo.files.items():
            if folder and not path.startswith(folder + "/"):
                continue
            inner = path[len(folder) + 1:] if folder else path
            if "/" in inner and not recursive:
                folders.add((folder + "/" if folder else "") + inner.split("/")[0])
                continue
            entries.append({"type": "file", "oid": repo.oid[path], "size": len(data), "path": path,
                            "lfs": {"oid": repo.sha256[path], "size": len(data), "pointerSize": 134}})
        entries += [{"type": "directory", "oid": hashlib.sha1(f.encode()).hexdigest(), "size": 0, "path": f}
                    for f in sorted(folders)]
        self._json(sorted(entries, key=lambda e: e["path"]), body)

    def _file(self, name: str, revision: str, path: str, body: bool) -> None:
        repo = self._repo(name, body)
        if repo is None or not self._revision(repo, revision, body):
            return
        data = repo.files.get(path)
        if data is None:
            return self._error(404, "EntryNotFound", f"{path} does not exist on \"{revision}\"", body,
                               {"X-Repo-Commit": repo.sha})
        start, status = 0, 200
        wanted = self.headers.get("Range", "")
        if wanted.startswith("bytes=") and wanted.endswith("-") and wanted[6:-1].isdigit():
            start, status = min(int(wanted[6:-1]), len(data)), 206
        headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{repo.sha256[path]}"',
                   "X-Linked-Etag": f'"{repo.sha256[path]}"', "X-Linked-Size": str(len(data)),
                   "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream",
                   "Content-Disposition": f'attachment; filename="{path.rsplit("/", 1)[-1]}"'}
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        self._send(status, data[start:], body, headers)

    # --- responses ------------------------------------------------------------------------------------

    def _json(self, value: object, body: bool) -> None:
        self._send(200, json.dumps(value).encode(), body, {"Content-Type": "application/json"})

    def _error(self, status: int, code: str, message: str, body: bool,
               headers: Mapping[str, str] | None = None) -> None:
        self._send(status, json.dumps({"error": message}).encode(), body,
                   {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message,
                    **(headers or {})})

    def _send(self, status: int, data: bytes, body: bool, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)


def split_gguf(source: str | os.PathLike[str], folder: str | os.PathLike[str], stem: str,
               n_parts: int = 2) -> list[Path]:
    """``source`` rewritten as a split model of ``n_parts`` files ``folder/stem-0000i-of-0000n.gguf``, as llama.cpp's
    ``gguf-split --split-max-tensors`` writes one (with the `gguf` package's writer): every metadata entry in the
    first part, the tensors spread in order, ``split.no`` / ``split.count`` / ``split.tensors.count`` in each."""
    import gguf

    reader = gguf.GGUFReader(os.fspath(source))
    arch = str(reader.fields["general.architecture"].contents())
    per_part = -(-len(reader.tensors) // n_parts)
    writer = gguf.GGUFWriter(os.fspath(Path(folder) / f"{stem}.gguf"), arch, split_max_tensors=per_part)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)  # a quantized one: its bytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    paths = [Path(folder) / f"{stem}-{i:05d}-of-{n_parts:05d}.gguf" for i in range(1, n_parts + 1)]
    assert all(p.is_file() for p in paths), sorted(Path(folder).iterdir())
    return paths
