"""Router mode's HTTP side: the router's own routes (llama-server's ``/models`` API, ``/props``, ``/health``) and
every other request relayed to the child of the model it names (``router`` has the table and the scheduler).

Behind the same ``Gate`` as ``serve`` (CORS, the API key on every route but ``/health``, body limits). The children
listen on 127.0.0.1 with a key only the router knows, so the router's key is the only way in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from samplechain.server import relay
from samplechain.server.limits import APIError
from samplechain.server.responses import error_body, reply, sse
from samplechain.server.router import Models, RouterConfig
from samplechain.server.state import ServerState

READ_ONLY = ("GET", "HEAD")
KEEPALIVE = 10.0  # seconds between comments on an idle /models/sse stream (a client that left is noticed)
SSE_BACKLOG = 1024  # events kept for a /models/sse client that reads slowly (later ones are dropped for it)


def create_router_app(models: Models, config: RouterConfig) -> FastAPI:
    """The router's ASGI app (served behind ``Gate``)."""
    app = FastAPI(title="samplechain router", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(APIError)
    async def api_error(req: Request, e: APIError) -> Response:
        if e.code == 499:
            return Response(status_code=499)  # nobody reads it: the client is gone
        return reply(error_body(req.url.path, e), e.code)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(req: Request, e: StarletteHTTPException) -> Response:
        err = APIError(e.status_code, "File Not Found" if e.status_code == 404 else str(e.detail),
                       "not_found_error" if e.status_code == 404 else "invalid_request_error")
        return reply(error_body(req.url.path, err), e.status_code)

    @app.exception_handler(Exception)
    async def server_error(req: Request, e: Exception) -> Response:
        return reply(error_body(req.url.path, APIError(500, f"{type(e).__name__}: {e}", "server_error")), 500)

    @app.get("/health")
    @app.get("/v1/health")
    async def health() -> Response:
        return reply({"status": "ok"})

    @app.get("/props")
    async def props(request: Request) -> Response:
        if request.query_params.get("model"):
            return await relay_request(request, models, config)
        return reply({"role": "router", "max_instances": config.models_max, "models_autoload": config.autoload,
                      "model_alias": "samplechain", "model_path": "none",
                      "default_generation_settings": {"params": {}, "n_ctx": 0},
                      "build_info": build_info(), "is_sleeping": False})

    @app.get("/models")
    @app.get("/v1/models")
    async def list_models(request: Request) -> Response:
        if request.query_params.get("reload"):
            try:
                models.reload()
            except ValueError as e:
                raise APIError(400, str(e)) from None
        await models.refresh_sleeping()
        return reply({"object": "list", "data": models.listing()})

    @app.post("/models/load")
    async def load(request: Request) -> Response:
        name = (await body_json(request)).get("model")
        inst = models.get(name) if isinstance(name, str) else None
        if inst is None:
            raise APIError(404, "model is not found", "not_found_error")
        if inst.running:
            raise APIError(400, "model is already running")
        await models.load(inst.spec.name)
        return reply({"success": True})

    @app.post("/models/unload")
    async def unload(request: Request) -> Response:
        name = (await body_json(request)).get("model")
        inst = models.get(name) if isinstance(name, str) else None
        if inst is None:
            raise APIError(400, "model is not found")
        if not inst.running:
            raise APIError(400, "model is not running")
        models.stop(inst.spec.name)
        return reply({"success": True})

    @app.post("/models")
    async def download(request: Request) -> Response:
        name = (await body_json(request)).get("model")
        if not isinstance(name, str) or not name.strip():
            raise APIError(400, "model must be a non-empty string")
        if models.get(name) is not None:
            raise APIError(400, f"model '{name}' already exists")
        if name in models.downloads:
            raise APIError(400, f"model '{name}' is already downloading")
        models.start_download(name)
        return reply({"success": True})

    @app.delete("/models")
    async def remove(request: Request) -> Response:
        name = request.query_params.get("model", "")
        if not name:
            raise APIError(400, "model must be a non-empty string")
        await models.remove(name)
        return reply({"success": True})

    @app.get("/models/sse")
    async def events(request: Request) -> Response:
        queue: asyncio.Queue = asyncio.Queue(maxsize=SSE_BACKLOG)
        models.subscribers.add(queue)

        async def stream() -> AsyncIterator[bytes]:
            try:
                yield b": subscribed\n\n"
                while True:
                    try:
                        message = await asyncio.wait_for(queue.get(), KEEPALIVE)
                    except asyncio.TimeoutError:
                        yield b": keep-alive\n\n"
                        continue
                    yield sse(message)
            finally:
                models.subscribers.discard(queue)

        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.api_route("/{path:path}", methods=["GET", "POST", "DELETE", "PUT", "PATCH"])
    async def anything(request: Request, path: str) -> Response:
        return await relay_request(request, models, config)

    return app


def build_info() -> str:
    from samplechain import __version__

    return f"b{__version__}-samplechain"


async def body_json(request: Request) -> dict[str, Any]:
    try:
        data = json.loads(await request.body() or b"{}")
    except ValueError:
        raise APIError(400, "the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    return data


async def relay_request(request: Request, models: Models, config: RouterConfig) -> Response:
    """Route a request to its model's child (loading the model first if needed) and relay the answer."""
    method = request.method
    body = await request.body()
    if method in READ_ONLY or method == "DELETE":
        name = request.query_params.get("model", "")
    else:
        name = (await body_json(request)).get("model", "")
    if not isinstance(name, str) or not name:
        raise APIError(400, "model name is missing from the request")
    inst = models.get(name)
    if inst is None:
        raise APIError(400, f"model '{name}' not found")
    name = inst.spec.name
    autoload = request.query_params.get("autoload")
    autoload_on = config.autoload if autoload is None else autoload in ("1", "true")
    if not autoload_on and not inst.running:
        raise APIError(400, "model is not loaded")
    if autoload_on:
        inst = await models.acquire(name, request.is_disconnected)
    elif not models.take(inst):
        raise APIError(503, f"model '{name}' is not running", "unavailable_error")
    if method not in READ_ONLY:
        inst.last_used = time.monotonic()
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            models.release(inst)

    try:
        if config.delay:
            await asyncio.sleep(config.delay)
        return await forward(request, models.http, inst.url, models.key, body, release, name)
    except BaseException:
        release()
        raise


async def forward(request: Request, client: Any, base: str, key: str, body: bytes, release: Any,
                  name: str) -> Response:
    """One request to a child, its answer relayed: a stream chunk by chunk (cut by the child's death: the API's
    final error event), anything else whole. The child's work stops when the client leaves."""
    import httpx2 as httpx

    path = request.url.path
    headers = [(k, v) for k, v in request.headers.items()
               if k.lower() not in relay.HOP_HEADERS and k.lower() not in ("authorization", "x-api-key")]
    headers.append(("authorization", f"Bearer {key}"))
    url = base + path + (f"?{request.url.query}" if request.url.query else "")
    dead = APIError(502, f"the instance of model '{name}' stopped before it answered", "server_error")
    try:
        answer = await _unless_gone(request, client.send(
            client.build_request(request.method, url, headers=headers, content=body), stream=True))
    except httpx.HTTPError:
        release()
        raise dead from None
    except BaseException:  # the client left (or the router is stopping): the dropped connection stops the child
        release()
        raise
    kept = [(k, v) for k, v in answer.headers.items() if k.lower() not in relay.HOP_HEADERS]
    if not answer.headers.get("content-type", "").startswith("text/event-stream"):
        try:
            data = await _unless_gone(request, answer.aread())
        except httpx.HTTPError:
            raise dead from None
        finally:
            await answer.aclose()
            release()
        return Response(content=data, status_code=answer.status_code, headers=dict(kept))

    async def chunks() -> AsyncIterator[bytes]:
        tail = relay.StreamTail(path)
        try:
            async for chunk in answer.aiter_raw():
                tail.see(chunk)
                yield chunk
        except httpx.HTTPError:
            yield tail.final_event(dead)
        finally:
            await answer.aclose()  # unread: its connection is closed, which stops the child's work
            release()

    return StreamingResponse(chunks(), status_code=answer.status_code, headers=dict(kept))


async def _unless_gone(request: Request, work: Any) -> Any:
    """``work``'s result (the child's answer, its body); when the client leaves first, the work is dropped (closing
    the child's connection stops what it does for it) and APIError 499."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise APIError(499, "the client left")
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


# --- serving ------------------------------------------------------------------------------------------------------


class Router:
    """The router's server: the app, its model table (created on the server's event loop) and uvicorn."""

    def __init__(self, config: RouterConfig, log_level: str = "warning") -> None:
        from samplechain.server.app import HTTPServer

        self.config = config
        self.state = ServerState(config.server)
        self.state.ready.set()  # the router itself has nothing to load
        self.models: Models | None = None
        holder = self

        class Lazy:
            """The app, built on the server's loop at its first request (the table's events belong to it)."""

            def __init__(self) -> None:
                self.app: Any = None

            async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
                if scope["type"] == "lifespan":
                    await holder.lifespan(receive, send)
                    return
                await self.app(scope, receive, send)

        self.lazy = Lazy()
        self.http = HTTPServer(self.state, log_level, app=self.lazy)

    async def lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    self.models = Models(self.config)
                except ValueError as e:
                    await send({"type": "lifespan.startup.failed", "message": str(e)})
                    return
                self.lazy.app = create_router_app(self.models, self.config)
                for name, inst in self.models.table.items():
                    if inst.spec.load_on_startup:
                        self.models.spawn(self._load_quietly(name))
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.models is not None:
                    await self.models.shutdown(max(self.config.server.shutdown_grace, 0) + 5)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _load_quietly(self, name: str) -> None:
        assert self.models is not None
        with contextlib.suppress(APIError):
            await self.models.load(name)

    @property
    def urls(self) -> list[str]:
        return self.http.urls

    def run(self) -> None:
        self.http.run()


class BackgroundRouter:
    """A router on a thread of this process (tests): ``with BackgroundRouter(config) as r: ... r.url``."""

    def __init__(self, config: RouterConfig, log_level: str = "error") -> None:
        self.router = Router(config, log_level)
        self.server = self.router.http.server
        self.thread = threading.Thread(target=self.router.run, name="samplechain-router", daemon=True)
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.time() > deadline:
                raise RuntimeError("the router did not start")
            time.sleep(0.01)
        self.url = self.router.urls[0]

    @property
    def models(self) -> Models:
        assert self.router.models is not None
        return self.router.models

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)

    def __enter__(self) -> BackgroundRouter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_router(config: RouterConfig, log_level: str = "warning") -> int:
    """Run the router until SIGTERM / SIGINT; its children are stopped with it."""
    try:
        router = Router(config, log_level)
    except OSError as e:
        print(f"samplechain serve: error: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"samplechain serve: router listening on {', '.join(router.urls)} (up to {config.models_max or 'any'} "
          f"models at once)", file=sys.stderr)
    router.run()
    return 0 if router.models is not None else 1


__all__ = ["BackgroundRouter", "Router", "RouterConfig", "create_router_app", "serve_router"]
