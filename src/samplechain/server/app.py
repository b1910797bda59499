"""The HTTP layer: llama-server's and OpenAI's routes over the engine (FastAPI + uvicorn; spec/server.md §2-3).

Handlers parse, tokenize and format; the engine thread does everything else. Each request's tasks send their
events through a thread-safe hand-off into the request's asyncio queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from samplechain.params import SamplingParams
from samplechain.server import request as rq
from samplechain.server import responses as rs
from samplechain.server import visualizer
from samplechain.server.engine import Engine, Task
from samplechain.server.request import MAX_BODY, APIError, Defaults, Options, bad_request, error_event
from samplechain.server.responses import reply

# the visualizer's page and assets are public, as llama-server's UI is (its API calls need the key)
PUBLIC_PATHS = ("/health", "/v1/health", *visualizer.PAGE_PATHS)


@dataclass
class ServerConfig:
    """``samplechain serve``'s settings (llama-server's flags, spec/server.md §9)."""

    model: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    n_slots: int = 4
    n_ctx: int = 0
    n_batch: int = 512
    n_threads: int | None = None
    device: str = "cpu"
    kernel: str | None = None
    api_keys: tuple[str, ...] = ()
    cors_origins: str = "localhost"  # loopback pages only; "*" any origin (without credentials), or a list
    cors_methods: str = "GET, POST, DELETE, OPTIONS"
    cors_headers: str = "*"
    cors_credentials: bool = True
    timeout: int = 600  # seconds a request body may take, or a response's writes stay blocked (llama-server's)
    head_timeout: float = 10.0  # seconds for a request's head to arrive in full (slowloris)
    shutdown_grace: float = 10.0  # seconds running requests may finish after SIGTERM / SIGINT
    metrics: bool = False
    slots: bool = True
    props: bool = False
    alias: tuple[str, ...] = ()
    context_shift: bool = False
    special: bool = False
    defaults: Defaults = field(default_factory=Defaults)
    speculation: Callable[[], Any] | None = None  # a fresh Speculation per task (n-gram drafters), or None


class ServerState:
    """The model and engine once loaded (the listener answers 503 until then)."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.model: Any = None
        self.engine: Engine | None = None
        self.error: str | None = None
        self.ready = threading.Event()
        self.failed = threading.Event()
        self.started = time.time()

    def start(self, model: Any = None, on_error: Callable[[], None] | None = None) -> threading.Thread:
        """Start the engine thread: it loads the model (unless given), then runs the engine. The model is only ever
        run on that thread: with OpenMP, a second thread driving the compiled forward makes libgomp throttle its
        spinning and every step about 3x slower on a small machine. ``ready`` is set once loaded; on failure the
        error is kept (503 bodies, /health) and ``on_error`` is called."""

        def run() -> None:
            try:
                loaded = model
                if loaded is None:
                    from samplechain.runtime import load_model

                    loaded = load_model(self.config.model, device=self.config.device,
                                        n_threads=self.config.n_threads, kernel=self.config.kernel)
                self.model = loaded
                self.engine = Engine(loaded, self.config.n_slots, self.config.n_ctx, self.config.n_batch,
                                     self.config.context_shift, self.config.special, self.config.speculation)
            except Exception as e:
                self.error = f"{type(e).__name__}: {e}"
                self.failed.set()
                if on_error is not None:
                    on_error()
                return
            self.ready.set()
            self.engine.run()

        thread = threading.Thread(target=run, name="samplechain-engine", daemon=True)
        thread.start()
        return thread

    def wait(self, timeout: float | None = None) -> None:
        """Until the model is loaded; raises RuntimeError with the load error."""
        deadline = None if timeout is None else time.time() + timeout
        while not self.ready.is_set():
            if self.failed.wait(0.05):
                raise RuntimeError(f"the model failed to load: {self.error}")
            if deadline is not None and time.time() > deadline:
                raise RuntimeError("the model did not load in time")

    @property
    def model_id(self) -> str:
        if self.config.alias:
            return sorted(self.config.alias)[0]
        return os.path.basename(self.model.path) if self.model is not None else ""

    def close(self) -> None:
        if self.engine is not None:
            self.engine.stop()


# --- middleware: CORS, readiness, API key, body limit, errors ---------------------------------------------------



class Gate:
    """Pure ASGI middleware in llama-server's order (spec/server.md §2.2): CORS headers, OPTIONS answered at once,
    503 while loading, the API key, then the route."""

    def __init__(self, app: Callable, state: ServerState) -> None:
        self.app, self.state = app, state

    def cors(self, origin: str | None, preflight: bool) -> list[tuple[bytes, bytes]]:
        """CORS headers: by default only loopback origins (a page on another site cannot drive a local server);
        ``*`` allows every origin but never with credentials; otherwise the listed origins (comma-separated)."""
        c = self.state.config
        credentials = c.cors_credentials
        value: str | None = None
        if c.cors_origins == "*":
            value, credentials = "*", False
        elif origin is not None:
            if c.cors_origins == "localhost":
                try:
                    host = urlsplit(origin).hostname
                except ValueError:
                    host = None
                allowed = host in ("localhost", "127.0.0.1", "::1")
            else:
                allowed = origin in (o.strip() for o in c.cors_origins.split(","))
            value = origin if allowed else None
        headers = [(b"vary", b"Origin")] if c.cors_origins != "*" else []
        if value is not None:
            headers.append((b"access-control-allow-origin", value.encode("latin-1")))
            if preflight:
                headers += [(b"access-control-allow-credentials", b"true" if credentials else b"false"),
                            (b"access-control-allow-methods", c.cors_methods.encode()),
                            (b"access-control-allow-headers", c.cors_headers.encode())]
        return headers

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        method, path = scope["method"], scope["path"]
        origin = headers.get("origin")
        cors = self.cors(origin, method == "OPTIONS")
        extra = [*cors, (b"server", b"samplechain")]

        async def send_with(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        if method == "OPTIONS":
            await _plain(send_with, 200, b"", b"text/html")
            return
        if (origin is not None and not any(k == b"access-control-allow-origin" for k, _ in cors)
                and not _same_origin(origin, headers.get("host")) and path not in PUBLIC_PATHS):
            # a page of another site: without a preflight (a text/plain POST) it could still start work here
            await _error(send_with, APIError(403, f"Origin {origin!r} is not allowed (see --cors-origins)",
                                             "permission_error"))
            return
        if not self.state.ready.is_set():
            message = "Loading model" if self.state.error is None else f"Model failed to load: {self.state.error}"
            await _error(send_with, APIError(503, message, "unavailable_error"))
            return
        keys = self.state.config.api_keys
        if keys and path not in PUBLIC_PATHS and not path.startswith(visualizer.ASSET_PREFIX):
            given = headers.get("authorization")
            given = given[7:] if given is not None and given.startswith("Bearer ") else given
            if given is None:
                given = headers.get("x-api-key")
            if given not in keys:
                await _error(send_with, APIError(401, "Invalid API Key", "authentication_error"))
                return
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY:
            await _error(send_with, APIError(413, "Payload Too Large", "invalid_request_error"))
            return
        try:
            await self.app(scope, receive, send_with)
        finally:
            if scope.get(rq.LARGE_BODY_KEY):
                await asyncio.to_thread(rq.release_memory)


def _same_origin(origin: str, host: str | None) -> bool:
    """Whether a page's origin is this server itself (its own page, whatever address it was reached by)."""
    try:
        return host is not None and urlsplit(origin).netloc.lower() == host.lower()
    except ValueError:
        return False


async def _plain(send: Callable, status: int, body: bytes, ctype: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _error(send: Callable, e: APIError) -> None:
    await _plain(send, e.code, rs.json_bytes(e.body()), b"application/json; charset=utf-8")


# --- running tasks ----------------------------------------------------------------------------------------------


@dataclass
class Job:
    """One task of a request before it is submitted: its prompt, its parameters and its sampler."""

    tokens: list[int]
    params: SamplingParams
    sampler: Any


class ClientGone(Exception):
    """The client of a request disconnected while it waited: its tasks are cancelled."""


DISCONNECT_POLL = 0.5  # seconds between two disconnect checks of a request that waits


class Run:
    """The tasks of one request and the queue their events arrive in (from the engine thread).

    A request that waits without a stream reads events with ``receive``: the read of the queue is one task that a
    poll never cancels (a wait with a timeout around a generator's ``anext`` closed the generator when it timed
    out, and every later event was lost); beside it, the client's connection is checked every
    ``DISCONNECT_POLL`` seconds, and a gone client cancels the tasks. A stream needs no polling: its response
    is cancelled when its client leaves, and that cancels the tasks."""

    def __init__(self, engine: Engine, is_disconnected: Callable[[], Awaitable[bool]]) -> None:
        self.engine = engine
        self.is_disconnected = is_disconnected
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[int, dict[str, Any]]] = asyncio.Queue()
        self.tasks: list[Task] = []
        self.backlog: deque[tuple[int, dict[str, Any]]] = deque()  # read while waiting for the slots, not yet used
        self._read: asyncio.Future | None = None
        self._next_poll = self.loop.time() + DISCONNECT_POLL  # when to check the client's connection next

    def submit(self, job: Job, opts: Options, index: int) -> None:
        def emit(ev: dict[str, Any]) -> None:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (index, ev))

        task = Task(tokens=job.tokens, params=job.params, emit=emit, n_predict=opts.n_predict, n_keep=opts.n_keep,
                    n_discard=opts.n_discard, stop=opts.stop, cache_prompt=opts.cache_prompt, id_slot=opts.id_slot,
                    n_indent=opts.n_indent, t_max_predict_ms=opts.t_max_predict_ms,
                    return_progress=opts.return_progress and opts.stream, sampler=job.sampler)
        self.tasks.append(task)
        self.engine.submit(task)

    def cancel(self) -> None:
        for t in self.tasks:
            if not t.cancelled.is_set():
                self.engine.cancel(t)
        if self._read is not None:
            self._read.cancel()
            self._read = None

    async def next(self) -> tuple[int, dict[str, Any]]:
        """A stream's next event: the backlog's first, else the queue's."""
        if self.backlog:
            return self.backlog.popleft()
        return await self.receive(watch=False)

    async def receive(self, watch: bool = True) -> tuple[int, dict[str, Any]]:
        """The queue's next event. With ``watch``, the client's connection is checked every ``DISCONNECT_POLL``
        seconds, events or not: a client that is gone cancels the tasks and raises ``ClientGone`` (a stream
        does not watch: its response is cancelled when the client leaves)."""
        if not watch and self._read is None:  # a stream: its response is cancelled, read and all, when it goes
            return await self.queue.get()
        while True:
            if self._read is None:
                self._read = asyncio.ensure_future(self.queue.get())
            timeout = max(self._next_poll - self.loop.time(), 0.0) if watch else None
            done, _ = await asyncio.wait((self._read,), timeout=timeout)
            if watch and self.loop.time() >= self._next_poll:
                self._next_poll = self.loop.time() + DISCONNECT_POLL
                if await self.is_disconnected():
                    self.cancel()
                    raise ClientGone
            if done:
                item = self._read.result()
                self._read = None
                return item

    async def started(self) -> None:
        """Wait until every task has a slot, one failed, or one has generated: before that, no byte of a stream
        is sent, so a task that cannot start is an HTTP error. The events read are kept, in order, for
        ``events``."""
        await self._gather("begin", keep=True)

    async def events(self) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        """Every event until each task has its final (or error) event. A task cut short (the server shutting
        down) gives its final event, then its error."""
        open_tasks = len(self.tasks)
        while open_tasks:
            index, ev = await self.next()
            if ev["type"] == "begin":
                continue
            if ev["type"] == "error" and ev.get("final") is not None:
                yield index, ev["final"]
                ev = {k: v for k, v in ev.items() if k != "final"}
            if ev["type"] in ("final", "error"):
                open_tasks -= 1
            yield index, ev

    async def finals(self) -> list[dict[str, Any]]:
        """Wait for every final result (non-streaming); the client leaving cancels the tasks (``ClientGone``),
        and so does an error (raised as the error it answers)."""
        finals = await self._gather("final", keep=False)
        return [finals[i] for i in sorted(finals)]

    async def _gather(self, kind: str, keep: bool) -> dict[int, dict[str, Any]]:
        """Read until every task has sent a ``kind`` event; an error raises (and cancels the tasks); other events
        go to the backlog when ``keep``."""
        got: dict[int, dict[str, Any]] = {}
        try:
            while len(got) < len(self.tasks):
                index, ev = await self.receive()
                if ev["type"] == "error":
                    raise error_event(ev)
                if ev["type"] == kind:
                    got[index] = ev
                elif keep:  # a task is generating: the stream starts (the others may still wait for a slot)
                    self.backlog.append((index, ev))
                    break
        except BaseException:
            self.cancel()
            raise
        return got


def sse(obj: Any) -> bytes:
    return b"data: " + rs.json_bytes(obj) + b"\n\n"


# --- the application --------------------------------------------------------------------------------------------


def create_app(state: ServerState) -> Any:
    """The ASGI application (FastAPI routes behind the ``Gate`` middleware)."""
    app = FastAPI(title="samplechain", docs_url=None, redoc_url=None, openapi_url=None)
    config = state.config

    @app.exception_handler(APIError)
    async def api_error(_: Request, e: APIError) -> Response:
        return reply(e.body(), e.code)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException) -> Response:
        if e.status_code == 404:
            return reply(APIError(404, "File Not Found", "not_found_error").body(), 404)
        if e.status_code == 405:
            return reply(APIError(405, "Method Not Allowed", "invalid_request_error").body(), 405)
        return reply(APIError(e.status_code, str(e.detail), "server_error").body(), e.status_code)

    @app.exception_handler(ClientGone)
    @app.exception_handler(ClientDisconnect)  # gone while sending its body
    async def client_gone(_: Request, e: Exception) -> Response:
        return Response(status_code=499)  # nobody reads it: the connection is closed

    @app.exception_handler(Exception)
    async def server_error(_: Request, e: Exception) -> Response:
        return reply(APIError(500, f"{type(e).__name__}: {e}", "server_error").body(), 500)

    def engine() -> Engine:
        assert state.engine is not None
        return state.engine

    def jobs(params: SamplingParams, opts: Options, prompts: list[list[int]]) -> list[Job]:
        """Each prompt times each of the ``n`` choices, with its sampler, built here (off the event loop and the
        engine thread): the grammar is compiled once, within its budget. Out-of-vocabulary logit-bias ids are a
        400 (llama-server skips them silently: spec/samplers P28)."""
        todo = [(p, choice_params(params, i)) for p in prompts for i in range(opts.n_cmpl)]
        built = rq.samplers([q for _, q in todo], state.model)
        return [Job(p, q, sampler) for (p, q), sampler in zip(todo, built, strict=True)]

    def check_fits(tokens: list[int]) -> None:
        n_ctx = engine().n_ctx_slot
        if len(tokens) >= n_ctx:
            raise APIError(400, f"request ({len(tokens)} tokens) exceeds the available context size ({n_ctx} "
                           "tokens), try increasing it", "exceed_context_size_error",
                           n_prompt_tokens=len(tokens), n_ctx=n_ctx)
        if not tokens:
            raise bad_request("the prompt is empty")

    def choice_params(params: SamplingParams, i: int) -> SamplingParams:
        """Choice ``i`` of ``n``: its own seed when the seed is fixed, so the choices differ."""
        if i == 0 or params.seed == SamplingParams().seed:
            return params
        return replace(params, seed=(params.seed + i) & 0xFFFFFFFF)

    def streaming(gen: AsyncIterator[bytes], run: Run) -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in gen:
                    yield chunk
            finally:
                run.cancel()  # the client went away (or the stream ended: then nothing is running)
        return StreamingResponse(body(), media_type="text/event-stream", headers={"X-Accel-Buffering": "no"})

    # --- simple routes ---------------------------------------------------------------------------------------

    @app.get("/health")
    @app.get("/v1/health")
    async def health() -> Response:
        return reply({"status": "ok"})

    @app.get("/v1/models")
    @app.get("/models")
    async def models() -> Response:
        m = state.model
        meta = {"vocab_type": 2, "n_vocab": m.config.n_vocab, "n_ctx": engine().n_ctx_slot,
                "n_ctx_train": m.config.n_ctx_train, "n_embd": m.config.n_embd,
                "n_params": m.transformer.n_params if hasattr(m.transformer, "n_params") else 0,
                "size": os.path.getsize(m.path), "ftype": ""}
        mid = state.model_id
        return reply({"object": "list",
                      "data": [{"id": mid, "aliases": sorted(config.alias), "tags": [], "object": "model",
                                "created": int(time.time()), "owned_by": "samplechain", "meta": meta}],
                      "models": [{"name": mid, "model": mid, "modified_at": "", "size": "", "digest": "",
                                  "type": "model", "description": "", "tags": [""], "capabilities": ["completion"],
                                  "parameters": "", "details": {"parent_model": "", "format": "gguf", "family": "",
                                                                "families": [""], "parameter_size": "",
                                                                "quantization_level": ""}}]})

    @app.get("/props")
    async def props() -> Response:
        m = state.model
        vocab = m.vocab
        opts = Options(n_predict=config.defaults.n_predict, n_keep=config.defaults.n_keep)

        def text(t: int | None) -> str:
            return vocab.token_bytes(t).decode("utf-8", "replace") if t is not None else ""

        return reply({
            "default_generation_settings": {"params": rs.settings(config.defaults.params, opts),
                                            "n_ctx": engine().n_ctx_slot},
            "total_slots": config.n_slots, "model_alias": state.model_id,
            "model_path": os.path.basename(m.path),  # the file's name: its folder is nobody's business
            "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": config.slots, "endpoint_props": config.props, "endpoint_metrics": config.metrics,
            "chat_template": vocab.chat_template or "", "chat_template_caps": {}, "bos_token": text(vocab.bos),
            "eos_token": text(vocab.eos), "build_info": rs.BUILD_INFO, "is_sleeping": False,
            "ui": False, "cors_proxy_enabled": False,
        })

    @app.post("/props")
    async def set_props() -> Response:
        if not config.props:
            raise APIError(501, "This server does not support changing global properties. Start it with `--props`",
                           "not_supported_error")
        return reply({"success": True})

    @app.post("/tokenize")
    async def tokenize(req: Request) -> Response:
        body = await rq.read_json(req)
        content = body.get("content")
        if content is None:
            return reply({"tokens": []})
        add_special = body.get("add_special", False)
        parse_special = body.get("parse_special", True)
        if not isinstance(add_special, bool) or not isinstance(parse_special, bool):
            raise bad_request("add_special and parse_special must be true or false")
        parts = [content] if isinstance(content, str) else content if isinstance(content, list) else []
        n_chars = sum(len(p) for p in parts if isinstance(p, str))
        if n_chars > rq.MAX_TOKENIZE_CHARS:
            raise bad_request(f"Field 'content': at most {rq.MAX_TOKENIZE_CHARS} characters, got {n_chars}")
        if isinstance(content, str):
            tokens = await asyncio.to_thread(state.model.tokenize, content, add_special=add_special,
                                             parse_special=parse_special)
        else:
            tokens = await asyncio.to_thread(rq.tokenize_mixed, state.model, content, add_special)
        if body.get("with_pieces"):
            pieces = []
            for t in tokens:
                data = state.model.vocab.token_bytes(t)
                try:
                    piece: Any = data.decode("utf-8")
                except UnicodeDecodeError:
                    piece = list(data)
                pieces.append({"id": t, "piece": piece})
            return reply({"tokens": pieces})
        return reply({"tokens": tokens})

    @app.post("/detokenize")
    async def detokenize(req: Request) -> Response:
        body = await rq.read_json(req)
        tokens = body.get("tokens") or []
        n_vocab = state.model.config.n_vocab
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise bad_request("'tokens' must be an array of token ids")
        if any(not 0 <= t < n_vocab for t in tokens):
            raise bad_request(f"token ids must be in [0, {n_vocab})")
        data = b"".join(state.model.vocab.token_bytes(t) for t in tokens)
        return reply({"content": data.decode("utf-8", "replace")})

    @app.post("/apply-template")
    async def apply_template(req: Request) -> Response:
        body = await rq.read_json(req)
        try:
            prompt, _ = await asyncio.to_thread(rq.chat_prompt, state.model, body)
        except ValueError as e:
            raise bad_request(str(e)) from None
        return reply({"prompt": prompt})

    @app.get("/slots")
    async def slots(req: Request) -> Response:
        if not config.slots:
            raise APIError(501, "This server does not support slots endpoint. Start it with `--slots`",
                           "not_supported_error")
        eng = engine()
        if req.query_params.get("fail_on_no_slot") in ("1", "true") and all(s.busy for s in eng.slots):
            raise APIError(503, "no slot available", "unavailable_error")
        out = []
        for s in eng.slots:
            task = s.task  # read once: the engine thread may release the slot meanwhile
            d: dict[str, Any] = {"id": s.id, "n_ctx": s.n_ctx, "speculative": eng.speculation is not None,
                                 "is_processing": task is not None}
            last = s.last_task if task is None else {
                "id_task": task.id, "n_prompt_tokens": len(task.tokens),
                "n_prompt_tokens_processed": s.timings.prompt_n, "n_prompt_tokens_cache": s.timings.cache_n,
                "params": task.params, "n_decoded": len(s.generated), "n_predict": task.n_predict}
            if last is not None:
                n_remain = -1 if last["n_predict"] < 0 else max(last["n_predict"] - last["n_decoded"], 0)
                d.update({k: last[k] for k in ("id_task", "n_prompt_tokens", "n_prompt_tokens_processed",
                                               "n_prompt_tokens_cache")})
                d["params"] = rs.settings(last["params"], Options(n_predict=last["n_predict"]))
                d["next_token"] = [{"has_next_token": task is not None,
                                    "has_new_line": task is not None and s.has_new_line,
                                    "n_remain": n_remain,
                                    "n_decoded": last["n_decoded"]}]
            out.append(d)
        return reply(out)

    @app.get("/metrics")
    async def metrics() -> Response:
        if not config.metrics:
            raise APIError(501, "This server does not support metrics endpoint. Start it with `--metrics`",
                           "not_supported_error")
        eng = engine()
        m = eng.metrics
        wp, wd = m.window_prompt, m.window_predicted
        rows = [
            ("counter", "prompt_tokens_total", "Number of prompt tokens processed.", m.prompt_tokens_total),
            ("counter", "prompt_tokens_cached_total", "Number of prompt tokens reused from the cache.", m.n_cached),
            ("counter", "prompt_seconds_total", "Prompt process time", m.prompt_seconds_total),
            ("counter", "tokens_predicted_total", "Number of generation tokens processed.",
             m.tokens_predicted_total),
            ("counter", "tokens_predicted_seconds_total", "Predict process time",
             m.tokens_predicted_seconds_total),
            ("counter", "n_decode_total", "Total number of llama_decode() calls", m.n_decode_total),
            ("counter", "n_tokens_max", "Largest observed n_tokens.", m.n_tokens_max),
            ("counter", "spec_decode_num_drafts_total", "Number of speculative drafts.", m.spec_drafts),
            ("counter", "spec_decode_num_draft_tokens_total", "Number of drafted tokens.", m.spec_draft_tokens),
            ("counter", "spec_decode_num_accepted_tokens_total", "Number of accepted draft tokens.",
             m.spec_accepted_tokens),
            ("gauge", "n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
             m.n_busy_slots_total / m.n_decode_total if m.n_decode_total else 0.0),
            ("gauge", "prompt_tokens_seconds", "Average prompt throughput in tokens/s.",
             wp[0] / wp[1] if wp[1] > 0 else 0.0),
            ("gauge", "predicted_tokens_seconds", "Average generation throughput in tokens/s.",
             wd[0] / wd[1] if wd[1] > 0 else 0.0),
            ("gauge", "requests_processing", "Number of requests processing.", sum(s.busy for s in eng.slots)),
            ("gauge", "requests_deferred", "Number of requests deferred.", eng.n_deferred),
        ]
        m.window_prompt, m.window_predicted = [0, 0.0], [0, 0.0]
        lines = []
        for kind, name, help_text, value in rows:
            lines += [f"# HELP llamacpp:{name} {help_text}", f"# TYPE llamacpp:{name} {kind}",
                      f"llamacpp:{name} {value}"]
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4",
                        headers={"Process-Start-Time-Unix": str(int(state.started))})

    # --- completions -----------------------------------------------------------------------------------------

    def prepare(body: dict[str, Any]) -> tuple[SamplingParams, Options]:
        params = rq.parse_sampling(body, config.defaults)
        opts = rq.parse_options(body, config.defaults, config.n_slots)
        return params, opts

    def prepare_completion(body: dict[str, Any]) -> tuple[SamplingParams, Options, list[Job]]:
        """A completion request's parameters and its tasks (each prompt checked against a slot's context)."""
        try:
            params, opts = prepare(body)
            prompts = rq.prompts(state.model, body, engine().n_ctx_slot, opts.n_cmpl)
        except ValueError as e:
            raise bad_request(str(e)) from None
        for p in prompts:
            check_fits(p)
        return params, opts, jobs(params, opts, prompts)

    @app.post("/completion")
    @app.post("/completions")
    async def completion(req: Request) -> Response:
        params, opts, todo = await asyncio.to_thread(prepare_completion, await rq.read_json(req))
        run = Run(engine(), req.is_disconnected)
        for k, job in enumerate(todo):
            run.submit(job, opts, k)
        texts = [state.model.vocab.detokenize(job.tokens) for job in todo]
        eog = tuple(sorted(state.model.vocab.eog))
        model_id = state.model_id
        if not opts.stream:
            finals = await run.finals()
            outs = [rs.native_final(f, model=model_id, prompt_text=texts[k], params=params, opts=opts, eog=eog,
                                    index=k) for k, f in enumerate(finals)]
            return reply(outs[0] if len(outs) == 1 else outs)
        await run.started()

        async def events() -> AsyncIterator[bytes]:
            async for index, ev in run.events():
                if ev["type"] == "progress":
                    yield sse(rs.native_progress(ev, index))
                elif ev["type"] == "token":
                    yield sse(rs.native_event(ev, params, opts, index))
                elif ev["type"] == "final":
                    yield sse(rs.native_final(ev, model=model_id, prompt_text=texts[index], params=params,
                                              opts=opts, eog=eog, index=index, streamed=True))
                elif ev["type"] == "error":
                    yield sse(error_event(ev).body())
                    return
        return streaming(events(), run)

    @app.post("/v1/completions")
    async def oai_completions(req: Request) -> Response:
        _, opts, todo = await asyncio.to_thread(prepare_completion, await rq.read_json(req))
        run = Run(engine(), req.is_disconnected)
        for k, job in enumerate(todo):  # every prompt's choices, in order
            run.submit(job, opts, k)
        cid, model_id = rs.completion_id(), state.model_id
        if not opts.stream:
            finals = await run.finals()
            return reply(rs.oai_completion(finals, cid, model_id))
        await run.started()
        created = int(time.time())

        async def events() -> AsyncIterator[bytes]:
            async for index, ev in run.events():
                env = rs.oai_envelope("text_completion", cid, model_id, created)
                if ev["type"] == "token":
                    if ev["text"] or ev["probs"] is not None:
                        probs = {"content": [ev["probs"]]} if ev["probs"] is not None else None
                        yield sse({"choices": [{"text": ev["text"], "index": index, "logprobs": probs,
                                                "finish_reason": None}], **env})
                elif ev["type"] == "final":
                    yield sse({"choices": [{"text": "", "index": index, "logprobs": None,
                                            "finish_reason": rs.finish_reason(ev)}], **env,
                               "usage": rs.usage([ev]), "timings": ev["timings"]})
                elif ev["type"] == "error":
                    yield sse(error_event(ev).body())
                    return
            yield b"data: [DONE]\n\n"
        return streaming(events(), run)

    def prepare_chat(body: dict[str, Any]) -> tuple[SamplingParams, Options, list[Job], str]:
        """A chat request's parameters, its prompt tokens (through the chat template) and the generation prompt."""
        try:
            text, generation_prompt = rq.chat_prompt(state.model, body, engine().n_ctx_slot)
            fields = {**body, **rq.response_format(body), **rq.chat_logprobs(body)}
            if generation_prompt and "generation_prompt" not in body:
                fields["generation_prompt"] = generation_prompt
            params, opts = prepare(fields)
        except ValueError as e:
            raise bad_request(str(e)) from None
        if params.reasoning_budget_tokens >= 0 and not params.reasoning_budget_start_tag:
            # a thinking budget from the request: the thinking block's tags, as the chat format gives them
            params = replace(params, reasoning_budget_start_tag=rs.ReasoningSplitter.START,
                             reasoning_budget_end_tags=(rs.ReasoningSplitter.END,))
        tokens = rq.tokenize_mixed(state.model, text, n_ctx=engine().n_ctx_slot)
        check_fits(tokens)
        return params, opts, jobs(params, opts, [tokens]), generation_prompt

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_completions(req: Request) -> Response:
        body = await rq.read_json(req)
        # templates, tokenizing and grammar compilation off the event loop: other streams keep flowing
        params, opts, todo, generation_prompt = await asyncio.to_thread(prepare_chat, body)
        tokens = todo[0].tokens
        vocab = state.model.vocab
        reasoning_format = body.get("reasoning_format", "auto")
        thinking = reasoning_format != "none"
        started = generation_prompt.rstrip().endswith(rs.ReasoningSplitter.START)
        with_logprobs = params.n_probs > 0 and bool(body.get("logprobs"))
        run = Run(engine(), req.is_disconnected)
        for k, job in enumerate(todo):
            run.submit(job, opts, k)
        cid, model_id = rs.completion_id(), state.model_id
        if not opts.stream:
            finals = await run.finals()
            split = []
            for f in finals:
                splitter = rs.ReasoningSplitter(thinking, started)
                split.append(splitter.push(f["content"], final=True))
            out = rs.oai_chat(finals, cid, model_id, split, with_logprobs)
            if opts.verbose:
                out["__verbose"] = {"prompt": vocab.detokenize(tokens), "content": finals[0]["content"]}
            return reply(out)
        await run.started()
        created = int(time.time())

        async def events() -> AsyncIterator[bytes]:
            splitters = [rs.ReasoningSplitter(thinking, started) for _ in range(opts.n_cmpl)]
            role_sent = [False] * opts.n_cmpl
            finals = []
            async for index, ev in run.events():
                env = rs.oai_envelope("chat.completion.chunk", cid, model_id, created)
                if ev["type"] == "error":
                    yield sse(error_event(ev).body())
                    return
                out = b""
                if ev["type"] == "progress":  # rides on the role chunk, then on empty deltas
                    delta0: dict[str, Any] = {} if role_sent[index] else {"role": "assistant", "content": None}
                    role_sent[index] = True
                    yield sse({"choices": [{"finish_reason": None, "index": index, "delta": delta0}], **env,
                               "prompt_progress": ev["progress"]})
                    continue
                if not role_sent[index]:
                    role_sent[index] = True
                    out += sse({"choices": [{"finish_reason": None, "index": index,
                                             "delta": {"role": "assistant", "content": None}}], **env})
                final = ev["type"] == "final"
                thought, content = splitters[index].push("" if final else ev["text"], final=final)
                delta: dict[str, Any] = {}
                if thought:
                    delta["reasoning_content"] = thought
                if content:
                    delta["content"] = content
                if delta or (not final and ev["probs"] is not None and with_logprobs):
                    chunk: dict[str, Any] = {"choices": [{"finish_reason": None, "index": index, "delta": delta}],
                                             **env}
                    if not final and ev["probs"] is not None and with_logprobs:
                        chunk["choices"][0]["logprobs"] = {"content": [ev["probs"]]}
                    if not final and opts.timings_per_token:
                        chunk["timings"] = ev["timings"]
                    out += sse(chunk)
                if final:
                    finals.append(ev)
                    last: dict[str, Any] = {"choices": [{"finish_reason": rs.finish_reason(ev), "index": index,
                                                         "delta": {}}], **env}
                    if not opts.include_usage:
                        last["timings"] = ev["timings"]
                    out += sse(last)
                if out:
                    yield out
            if opts.include_usage and finals:
                yield sse({"choices": [], **rs.oai_envelope("chat.completion.chunk", cid, model_id, created),
                           "usage": rs.usage(finals), "timings": finals[-1]["timings"]})
            yield b"data: [DONE]\n\n"
        return streaming(events(), run)

    visualizer.add_routes(app, state)
    return app


class HTTPServer:
    """uvicorn serving the app with samplechain's connection limits and graceful shutdown.

    On SIGTERM / SIGINT (or ``shutdown``): the listener closes, queued requests get a 503, running requests may
    finish within ``shutdown_grace`` seconds, then each is cut with its final event and a 503 error; then the
    process exits 0 (uvicorn's own handler re-raises the signal after its shutdown, which exits with -15). A
    second signal quits at once."""

    def __init__(self, state: ServerState, log_level: str, backlog: int = 2048) -> None:
        import uvicorn

        from samplechain.server.connection import timed

        c = state.config
        self.state = state
        self.signalled = False
        outer = self

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                if threading.current_thread() is not threading.main_thread():
                    yield
                    return
                handled = (signal.SIGINT, signal.SIGTERM)
                previous = {sig: signal.signal(sig, outer._on_signal) for sig in handled}
                try:
                    yield
                finally:
                    for sig, handler in previous.items():
                        signal.signal(sig, handler)

        self.server = Server(uvicorn.Config(
            Gate(create_app(state), state), host=c.host, port=c.port, log_level=log_level, backlog=backlog,
            http=timed(c.head_timeout, c.timeout), timeout_keep_alive=5, server_header=False,
            # a backstop only: the engine cuts every task at the end of the grace period (after its step)
            timeout_graceful_shutdown=max(c.shutdown_grace, 0) + 30))

    def _on_signal(self, sig: int, frame: Any) -> None:
        """On the main thread, between two bytecodes: it may have interrupted a ``queue.put`` there, so the
        engine is told on a thread of its own (a lock taken here could never be released)."""
        self.signalled = True
        if self.server.should_exit:
            self.server.force_exit = True
            return
        self.server.should_exit = True
        threading.Thread(target=self.shutdown, name="samplechain-shutdown", daemon=True).start()

    def shutdown(self) -> None:
        """Stop accepting and drain the engine (see the class)."""
        if self.state.engine is not None:
            self.state.engine.drain(max(self.state.config.shutdown_grace, 0))
        self.server.should_exit = True


class BackgroundServer:
    """A server on a thread of this process (tests, notebooks, embedding): ``with start() as s: ... s.url``."""

    def __init__(self, config: ServerConfig, model: Any = None, log_level: str = "error") -> None:
        self.state = ServerState(config)
        self.state.start(model)
        self.state.wait()
        self.http = HTTPServer(self.state, log_level)
        self.server = self.http.server
        self.thread = threading.Thread(target=self.server.run, name="samplechain-http", daemon=True)
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.time() > deadline:
                self.state.close()
                raise RuntimeError(f"the server did not start on {config.host}:{config.port}")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{config.host}:{self.port}"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.state.close()

    def shutdown(self, timeout: float = 60) -> None:
        """The graceful shutdown a signal starts (``HTTPServer.shutdown``), waited for."""
        self.http.shutdown()
        self.thread.join(timeout=timeout)
        self.state.close()

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start(model: Any = None, **config: Any) -> BackgroundServer:
    """Start a server in the background: ``model`` a loaded ``Model`` (default: load ``config['model']`` or the
    packaged SmolLM2), ``config`` fields of :class:`ServerConfig` (``port=0``, the default here, picks a free port)."""
    config.setdefault("port", 0)
    return BackgroundServer(ServerConfig(**config), model)


def serve(config: ServerConfig, log_level: str = "warning") -> int:
    """Run the server until SIGTERM / SIGINT (exit status 0 after a graceful shutdown): the listener first (503
    while the model loads), as llama-server. A model that fails to load stops the server (exit status 1)."""
    import sys

    state = ServerState(config)
    http = HTTPServer(state, log_level, backlog=512)

    def failed() -> None:
        print(f"samplechain serve: error: {state.error}", file=sys.stderr)
        http.server.should_exit = True

    def report() -> None:
        if state.ready.wait() and state.model is not None:
            print(f"samplechain serve: model loaded ({state.model.path}, kernel {state.model.transformer.kernel})",
                  file=sys.stderr)

    state.start(on_error=failed)
    threading.Thread(target=report, daemon=True).start()
    if config.cors_origins == "*" and not config.api_keys:
        print("warning: CORS allows every origin and no API key is set; any web page can use the model",
              file=sys.stderr)
    print(f"samplechain serve: listening on http://{config.host}:{config.port} ({config.n_slots} slots)",
          file=sys.stderr)
    try:
        http.server.run()
    finally:
        state.close()
    status = 1 if state.error is not None else 0
    if http.signalled:  # every client has its answer: skip the interpreter's teardown (freeing the model, ~1 s)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status
