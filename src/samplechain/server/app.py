"""The HTTP server: llama-server's and OpenAI's routes over the engine (FastAPI + uvicorn; llama-server's
route table is in tools/server/server.cpp).

Handlers parse, tokenize and format (one router per API family: ``routes_native``, ``routes_openai`` and the
``visualizer``); the engine thread does everything else. Each request's tasks send their events through a
thread-safe hand-off into the request's asyncio queue (``run.Run``). Here: the ``Gate`` middleware, the app, and
uvicorn around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from samplechain.server import request as rq
from samplechain.server import responses as rs
from samplechain.server import (
    routes_anthropic,
    routes_embeddings,
    routes_native,
    routes_openai,
    routes_responses,
    visualizer,
)
from samplechain.server.config import ServerConfig
from samplechain.server.limits import MAX_BODY, APIError
from samplechain.server.responses import reply
from samplechain.server.run import ClientGone
from samplechain.server.sleep import needs_model
from samplechain.server.state import ServerState

__all__ = ["BackgroundServer", "Gate", "HTTPServer", "ServerConfig", "ServerState", "create_app", "serve", "start"]

# the visualizer's page and assets and the web UI's public files are public, as llama-server's UI is (its API calls
# need the key)
FRONTEND_PATHS = (*visualizer.PAGE_PATHS, *routes_native.UI_FILES)
PUBLIC_PATHS = ("/health", "/v1/health", *FRONTEND_PATHS)


# --- middleware: CORS, readiness, API key, body limit, errors ---------------------------------------------------


class Gate:
    """Pure ASGI middleware in llama-server's order (its pre-routing handler in
    tools/server/server-http.cpp): CORS headers, OPTIONS answered at once,
    503 while loading, the API key, then the route; with ``--sleep-idle-seconds``, a request that needs the model
    wakes it and waits for it (server/sleep.py)."""

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
            await _error(send_with, path, APIError(403, f"Origin {origin!r} is not allowed (see --cors-origins)",
                                             "permission_error"))
            return
        frontend = path in FRONTEND_PATHS or path.startswith(visualizer.ASSET_PREFIX)
        if not self.state.config.ui and frontend and path != "/sw.js":  # --no-ui (the worker that removes itself stays)
            await _error(send_with, path, APIError(404, "File Not Found", "not_found_error"))
            return
        if not self.state.ready.is_set() and not frontend:  # the page may load (and show that the model loads)
            message = "Loading model" if self.state.error is None else f"Model failed to load: {self.state.error}"
            await _error(send_with, path, APIError(503, message, "unavailable_error"))
            return
        keys = self.state.config.api_keys
        if keys and path not in PUBLIC_PATHS and not frontend:
            given = headers.get("authorization")
            given = given[7:] if given is not None and given.startswith("Bearer ") else given
            if given is None:
                given = headers.get("x-api-key")
            if given not in keys:
                await _error(send_with, path, APIError(401, "Invalid API Key", "authentication_error"))
                return
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY:
            await _error(send_with, path, APIError(413, "Payload Too Large", "invalid_request_error"))
            return
        sleeper = self.state.sleeper
        uses_model = sleeper is not None and not frontend and needs_model(self.app, scope)
        if uses_model:  # in flight until its response is sent; a sleeping model is woken and waited for
            try:
                await sleeper.enter()
            except APIError as e:
                await _error(send_with, path, e)
                return
        try:
            await self.app(scope, receive, send_with)
        finally:
            if uses_model:
                sleeper.leave()
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


async def _error(send: Callable, path: str, e: APIError) -> None:
    await _plain(send, e.code, rs.json_bytes(rs.error_body(path, e)), b"application/json; charset=utf-8")


# --- the application --------------------------------------------------------------------------------------------


def create_app(state: ServerState) -> FastAPI:
    """The ASGI application: every API family's routes and the error bodies (served behind the ``Gate``)."""
    app = FastAPI(title="samplechain", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(APIError)
    async def api_error(req: Request, e: APIError) -> Response:
        return reply(rs.error_body(req.url.path, e), e.code)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(req: Request, e: StarletteHTTPException) -> Response:
        if e.status_code == 404:
            err = APIError(404, "File Not Found", "not_found_error")
        elif e.status_code == 405:
            err = APIError(405, "Method Not Allowed", "invalid_request_error")
        else:
            err = APIError(e.status_code, str(e.detail), "server_error")
        return reply(rs.error_body(req.url.path, err), e.status_code)

    @app.exception_handler(ClientGone)
    @app.exception_handler(ClientDisconnect)  # gone while sending its body
    async def client_gone(_: Request, e: Exception) -> Response:
        return Response(status_code=499)  # nobody reads it: the connection is closed

    @app.exception_handler(Exception)
    async def server_error(req: Request, e: Exception) -> Response:
        return reply(rs.error_body(req.url.path, APIError(500, f"{type(e).__name__}: {e}", "server_error")), 500)

    for router in (routes_native.router(state), routes_openai.router(state), routes_anthropic.router(state),
                   routes_responses.router(state), routes_embeddings.router(state), visualizer.router(state)):
        app.include_router(router)
    return app


# --- serving ----------------------------------------------------------------------------------------------------


class HTTPServer:
    """uvicorn serving the app with samplechain's connection limits and graceful shutdown.

    On SIGTERM / SIGINT (or ``shutdown``): the listener closes, queued requests get a 503, running requests may
    finish within ``shutdown_grace`` seconds, then each is cut with its final event and a 503 error; then the
    process exits 0 (uvicorn's own handler re-raises the signal after its shutdown, which exits with -15). A
    second signal quits at once."""

    def __init__(self, state: ServerState, log_level: str, backlog: int = 2048, app: Callable | None = None) -> None:
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

        self.sockets = listen(c.host, c.port)
        self.server = Server(uvicorn.Config(
            Gate(app or create_app(state), state), host=c.host, port=c.port, log_level=log_level, backlog=backlog,
            http=timed(c.head_timeout, c.timeout), timeout_keep_alive=5, server_header=False,
            # a backstop only: the engine cuts every task at the end of the grace period (after its step)
            timeout_graceful_shutdown=max(c.shutdown_grace, 0) + 30))

    @property
    def urls(self) -> list[str]:
        """Where it listens: ``http://host:port`` per TCP address, the path of a Unix socket."""
        out = []
        for sock in self.sockets:
            if sock.family == getattr(socket, "AF_UNIX", None):
                out.append(sock.getsockname())
            else:
                host, port = sock.getsockname()[:2]
                out.append(f"http://{f'[{host}]' if ':' in host else host}:{port}")
        return out

    def run(self) -> None:
        self.server.run(sockets=self.sockets)

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
        self.state.drain(max(self.state.config.shutdown_grace, 0))
        self.server.should_exit = True


class BackgroundServer:
    """A server on a thread of this process (tests, notebooks, embedding): ``with start() as s: ... s.url``."""

    def __init__(self, config: ServerConfig, model: Any = None, log_level: str = "error") -> None:
        self.state = ServerState(config)
        self.state.start(model)
        self.state.wait()
        self.http = HTTPServer(self.state, log_level)
        self.server = self.http.server
        self.thread = threading.Thread(target=self.http.run, name="samplechain-http", daemon=True)
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.time() > deadline:
                self.state.close()
                raise RuntimeError(f"the server did not start on {config.host}:{config.port}")
            time.sleep(0.01)
        self.port = self.http.sockets[0].getsockname()[1]
        self.url = self.http.urls[0]

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


def listen(hosts: str, port: int) -> list[socket.socket]:
    """Listening sockets for llama-server's ``--host``: comma-separated addresses, each bound to ``port`` (``0``: the
    first picks a free port and the others take the same one), or Unix socket paths ending in ``.sock``. With
    several addresses, ``::`` binds IPv6 only (``IPV6_V6ONLY``). OSError names the address that failed."""
    names = [h.strip() for h in hosts.split(",") if h.strip()]
    if not names:
        raise ValueError("--host requires at least one address")
    out: list[socket.socket] = []
    try:
        for name in names:
            if name.endswith(".sock"):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                if os.path.exists(name):
                    os.unlink(name)
                sock.bind(name)
            else:
                host = name[1:-1] if name.startswith("[") and name.endswith("]") else name
                family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                     flags=socket.AI_PASSIVE)[0]
                sock = socket.socket(family, kind, proto)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6 and len(names) > 1:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                try:
                    sock.bind(address)
                except OSError as e:
                    sock.close()
                    raise OSError(e.errno, f"couldn't bind HTTP server socket, hostname: {name}, port: {port}: "
                                           f"{e.strerror}") from None
                port = sock.getsockname()[1]
            sock.set_inheritable(True)
            sock.listen(2048)  # listening now: a client that reads "listening on" may connect at once
            out.append(sock)
    except BaseException:
        for sock in out:
            sock.close()
        raise
    return out


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
    try:
        http = HTTPServer(state, log_level, backlog=512)
    except (OSError, socket.gaierror) as e:
        print(f"samplechain serve: error: {e.strerror or e}", file=sys.stderr)
        return 1

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
    print(f"samplechain serve: listening on {', '.join(http.urls)} ({config.n_slots} slots)", file=sys.stderr)
    try:
        http.run()
    finally:
        state.close()
    status = 1 if state.error is not None else 0
    if http.signalled:  # every client has its answer: skip the interpreter's teardown (freeing the model, ~1 s)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status
