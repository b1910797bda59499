"""Router mode (``samplechain serve --models-dir DIR``, ``--models-preset FILE`` or ``--router``): many models behind
one server, each in a ``serve`` child process of its own, started when a request names it.

As llama-server's router (``tools/server/server-models.cpp``): a request is routed by its ``model`` (the JSON body's
field, a GET's ``?model=``). A model that is not running is loaded on demand (``--models-autoload``, the default; a
request's ``?autoload=`` overrides), at most ``--models-max`` at once. When they are all running, the least recently
used idle model is stopped for the next one: a model serving a request is never stopped. Requests waiting for a
model form one first-in-first-out queue, and the requests for one model share one entry, so one load serves them
all; a client that leaves the queue gives up its place (and a model stopped for it goes to the next waiter) without
stopping anything more. A child that dies is reported in ``/models`` (``failed``, its exit status) and started
again by the next request for it; a request it was answering gets an error in its API's shape.

Everything here runs on the router's event loop (one thread), so the table needs no lock. ``Models`` is the table
and its scheduler; the HTTP side is ``router_app``.

``LLAMA_SERVER_DEBUG_FAKE_TIMING`` (llama-server's test hook, set by its test suite): every load and every proxied
request waits 2 s first, so that tests can see a model busy or loading.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import re
import secrets
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from samplechain.runtime import hub_cache
from samplechain.server.config import ServerConfig
from samplechain.server.limits import APIError
from samplechain.server.router_models import ModelSpec, child_options, load_specs

LISTENING = re.compile(r"listening on (http://[^\s,]+)")
FAKE_TIMING = 2.0  # seconds (LLAMA_SERVER_DEBUG_FAKE_TIMING)


@dataclass
class RouterConfig:
    """``serve``'s router mode: the router's own server settings and where its models come from."""

    server: ServerConfig  # the router's listener, API keys, CORS and timeouts
    models_dir: str | None = None
    models_preset: str | None = None
    cache: bool = True  # the Hugging Face cache's models too
    models_max: int = 4  # models running at once (0: no limit)
    autoload: bool = True  # --models-autoload / --no-models-autoload
    child_args: tuple[str, ...] = ()  # every child's serve flags: the router's own, less what the router controls
    child_env: dict[str, str] = field(default_factory=dict)  # and environment (secrets: never on a command line)
    # an INI option -> serve flags (``("c", "4096")`` -> ``["-c", "4096"]``); ValueError for an unknown key
    flags: Callable[[str, str], list[str]] = lambda key, value: [f"--{key}", value]
    command: tuple[str, ...] = (sys.executable, "-m", "samplechain", "serve")
    load_timeout: float = 600.0  # seconds a child may take to load its model
    preset_keys: frozenset[str] | None = None  # the keys the preset may use (one from a hub repo), else any
    # the test hook: seconds every load and every relayed request wait first (LLAMA_SERVER_DEBUG_FAKE_TIMING: 2)
    delay: float = field(default_factory=lambda: FAKE_TIMING * bool(os.environ.get("LLAMA_SERVER_DEBUG_FAKE_TIMING")))


@dataclass
class Instance:
    """A model's state in the table, and its child process while it runs."""

    spec: ModelSpec
    status: str = "unloaded"  # unloaded, loading, loaded, downloading
    process: asyncio.subprocess.Process | None = None
    url: str | None = None
    args: list[str] = field(default_factory=list)
    requests: int = 0  # proxied requests in flight
    last_used: float = 0.0
    stopping: bool = False
    sleeping: bool = False  # its child unloaded its model after --sleep-idle-seconds (it reloads by itself)
    failed: bool = False
    fail_on_exit: bool = False  # stopped because it did not load in time: its exit is a failure
    exit_code: int | None = None
    info: dict[str, Any] = field(default_factory=dict)  # the child's /v1/models entry
    log: collections.deque = field(default_factory=lambda: collections.deque(maxlen=20))
    loads: int = 0  # children started
    stops: int = 0  # children asked to stop (unloads and evictions)

    @property
    def running(self) -> bool:
        return self.status in ("loading", "loaded")


@dataclass
class Entry:
    """The queue's entry for one model: how many requests wait for it, and whether one of them is loading it."""

    name: str
    waiters: int = 1
    loading: bool = False


class Models:
    """The model table and its scheduler (llama-server's ``server_models`` and ``server_lru_sched``)."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.key = secrets.token_urlsafe(24)  # the children's API key ($LLAMA_API_KEY): only the router reaches them
        self.table: dict[str, Instance] = {}
        self.queue: collections.deque[Entry] = collections.deque()
        self.changed = asyncio.Event()
        self.subscribers: set[asyncio.Queue] = set()  # /models/sse
        self.tasks: set[asyncio.Task] = set()
        self.downloads: dict[str, asyncio.Task] = {}  # POST /models, by model id
        self._http: Any = None  # the client of every request to the children (``http``)
        self.reload()

    # --- the list ---------------------------------------------------------------------------------------------

    def reload(self) -> None:
        """Read the sources again: new models are listed, changed ones updated; one that is running but changed or
        gone is stopped."""
        c = self.config
        specs = load_specs(c.models_dir, c.models_preset, hub_cache.cached_models if c.cache else None, cached_file,
                           c.preset_keys)
        for spec in specs.values():  # a preset's unknown option is an error now, not when its model loads
            for key, value in child_options(spec):
                try:
                    c.flags(key, value)
                except ValueError as e:
                    raise ValueError(f"--models-preset: [{spec.name}]: {e}") from None
        for name, inst in list(self.table.items()):
            spec = specs.get(name)
            if spec is None or not spec.same_as(inst.spec):
                if inst.running:
                    self.stop(name)
                if spec is None and not inst.running:
                    del self.table[name]
                    self.notify("model_remove", name)
        for name, spec in specs.items():
            if name in self.table:
                self.table[name].spec = spec
            else:
                self.table[name] = Instance(spec)
        self.notify("models_reload", "*")

    def get(self, name: str) -> Instance | None:
        """A model by name or alias (its ``alias`` option), or None."""
        inst = self.table.get(name)
        if inst is not None:
            return inst
        for inst in self.table.values():
            aliases = inst.spec.options.get("alias", inst.spec.options.get("a", ""))
            if name in (a.strip() for a in aliases.split(",")):
                return inst
        return None

    def notify(self, event: str, model: str, data: Any = None) -> None:
        """An event for ``/models/sse`` subscribers, and a wake-up for everything waiting on the table."""
        message = {"model": model, "event": event, **({"data": data} if data is not None else {})}
        for q in self.subscribers:
            with contextlib.suppress(asyncio.QueueFull):  # a subscriber that does not read loses events
                q.put_nowait(message)
        self.changed.set()

    def set_status(self, name: str, status: str) -> None:
        inst = self.table[name]
        inst.status = status
        self.notify("model_status", name, {"status": status})

    async def wait_change(self, timeout: float = 0.2) -> None:
        self.changed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.changed.wait(), timeout)

    @property
    def http(self) -> Any:
        """One HTTP client for everything the router asks its children (made on first use, on the router's loop):
        its connections are pooled, and plain HTTP to 127.0.0.1 needs no certificates (loading them took seconds
        on a busy machine, for every request)."""
        if self._http is None:
            import httpx2 as httpx

            self._http = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), verify=False,
                                           limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        return self._http

    # --- the scheduler ----------------------------------------------------------------------------------------

    def n_running(self) -> int:
        return sum(1 for i in self.table.values() if i.running)

    def has_capacity(self) -> bool:
        return self.config.models_max <= 0 or self.n_running() < self.config.models_max

    def queued(self, name: str) -> Entry | None:
        return next((e for e in self.queue if e.name == name), None)

    def victim(self) -> str | None:
        """The least recently used model that can be stopped: loaded, idle, not stopping, no request waiting."""
        idle = [(i.last_used, n) for n, i in self.table.items()
                if i.status == "loaded" and i.requests == 0 and not i.stopping and self.queued(n) is None]
        return min(idle)[1] if idle else None

    def join(self, name: str) -> None:
        entry = self.queued(name)
        if entry is not None:
            entry.waiters += 1
        else:
            self.queue.append(Entry(name))

    def leave(self, name: str) -> None:
        entry = self.queued(name)
        if entry is not None:
            entry.waiters -= 1
            if entry.waiters <= 0:
                self.queue.remove(entry)

    def tick(self) -> None:
        """Stop idle models while the queue needs more slots than are free or being freed."""
        if self.config.models_max <= 0 or not self.queue:
            return
        running = [i for i in self.table.values() if i.running]
        n_stopping = sum(1 for i in running if i.stopping)
        n_needed = sum(1 for e in self.queue if not e.loading)
        n_claimed = sum(1 for e in self.queue if e.loading and e.name in self.table and not self.table[e.name].running)
        n_free = self.config.models_max - len(running) + n_stopping - n_claimed
        while n_free < n_needed:
            name = self.victim()
            if name is None:
                return  # every running model is busy: wait for a request to end
            self.stop(name)
            n_free += 1

    def try_claim(self, name: str) -> bool:
        """Whether it is this model's turn to load (first in the queue, nobody loading it, a slot free)."""
        if not self.queue or self.queue[0].name != name or self.queue[0].loading or not self.has_capacity():
            return False
        self.queue[0].loading = True
        return True

    def claim_done(self, name: str, ok: bool) -> None:
        entry = self.queued(name)
        if entry is not None and not ok:
            entry.loading = False

    def take(self, inst: Instance) -> bool:
        """Count a request on a loaded model (it is then never stopped for another); False when it is not loaded."""
        if inst.status != "loaded" or inst.stopping or inst.url is None:
            return False
        inst.requests += 1
        return True

    def release(self, inst: Instance) -> None:
        """A request relayed to ``inst`` has ended: an idle model may make room for the queue."""
        inst.requests -= 1
        if inst.requests == 0:
            self.tick()
            self.changed.set()

    async def acquire(self, name: str, gone: Callable[[], Any]) -> Instance:
        """The model, loaded, with this request counted on it (``release`` when done): queued for a slot and loaded
        first if needed. ``gone``: an awaitable check that the client has left (then APIError 499). APIError 503
        when its load failed."""
        inst = self.table[name]
        if self.take(inst):
            return inst
        queued = False
        saw_loading = False
        try:
            while True:
                inst = self.table.get(name)
                if inst is None:
                    raise APIError(400, f"model '{name}' not found")
                if self.take(inst):
                    return inst  # counted before it leaves the queue: nothing can stop it in between
                if inst.status == "loading":
                    saw_loading = True
                elif inst.status == "unloaded" and saw_loading:
                    if inst.failed:
                        raise APIError(503, f"model '{name}' failed to load (exit status {inst.exit_code})"
                                            f"{': ' + inst.log[-1] if inst.log else ''}", "unavailable_error")
                    raise APIError(503, f"model '{name}' was stopped while it loaded", "unavailable_error")
                if not queued and (inst.status == "unloaded" or inst.stopping):
                    self.join(name)  # the next instance serves it
                    self.tick()
                    queued = True
                if await gone():
                    raise APIError(499, "the client left while the model was loading")
                if inst.status == "unloaded" and not inst.stopping and self.try_claim(name):
                    ok = False
                    try:
                        await self.load(name)
                        saw_loading = ok = True
                    except APIError:
                        pass
                    finally:
                        self.claim_done(name, ok)  # also when cancelled: the next waiter may claim it
                    self.tick()
                    continue
                await self.wait_change()
        finally:
            if queued:
                self.leave(name)
                self.tick()  # a slot freed for this request goes to the next one

    # --- children ---------------------------------------------------------------------------------------------

    def child_argv(self, inst: Instance) -> list[str]:
        argv = [*self.config.command, "--host", "127.0.0.1", "--port", "0", "--alias", inst.spec.name]
        for key, value in child_options(inst.spec):
            argv += self.config.flags(key, value)
        return argv + list(self.config.child_args)

    async def load(self, name: str) -> None:
        """Start the model's child (``loading``; ``loaded`` once its ``/health`` says so). Stops the least
        recently used idle model first when none is free (APIError 503 when all are busy)."""
        if self.config.delay:
            await asyncio.sleep(self.config.delay)
        inst = self.table.get(name)
        if inst is None:
            raise APIError(400, f"model '{name}' not found")
        if not self.has_capacity():
            victim = self.victim()
            if victim is not None:
                self.stop(victim)
                while victim in self.table and self.table[victim].running:
                    await self.wait_change()
        if inst.status != "unloaded" or inst.stopping:
            return
        if not self.has_capacity():
            raise APIError(503, f"model limit reached ({self.config.models_max} running, all busy), try again "
                                   "later", "unavailable_error")
        inst.args = self.child_argv(inst)
        inst.failed, inst.exit_code, inst.info, inst.url, inst.sleeping = False, None, {}, None, False
        inst.fail_on_exit = False
        inst.last_used = time.monotonic()
        inst.loads += 1
        self.set_status(name, "loading")
        global _PRCTL
        if _PRCTL is None:
            _PRCTL = _parent_death_signal()
        try:
            inst.process = await asyncio.create_subprocess_exec(
                *inst.args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent,
                env={**os.environ, **self.config.child_env, "LLAMA_API_KEY": self.key})  # not in args: /models has them
        except OSError as e:
            inst.failed, inst.exit_code = True, None
            inst.log.append(f"cannot start {inst.args[0]}: {e.strerror}")
            self.set_status(name, "unloaded")
            raise APIError(503, f"model '{name}' could not be started: {e.strerror}", "unavailable_error") from None
        except BaseException:  # cancelled while starting it: nothing runs, so nothing counts
            self.set_status(name, "unloaded")
            raise
        self.spawn(self.watch(name, inst.process))

    def spawn(self, coro: Any) -> asyncio.Task:
        """A task of the router's, kept until it ends (the loop holds tasks only weakly)."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def watch(self, name: str, process: asyncio.subprocess.Process) -> None:
        """A child's life: its output (kept, and echoed with its name), ``loaded`` when its model is, ``unloaded``
        when it exits (``failed`` unless it was asked to stop)."""
        inst = self.table[name]
        ready = self.spawn(self.ready_check(name, process))
        assert process.stdout is not None
        while True:
            try:
                line = await process.stdout.readline()
            except ValueError:  # a line past the reader's limit: its next part
                line = await process.stdout.read(1 << 16)
            if not line:
                break
            text = line.decode("utf-8", "replace").rstrip()
            inst.log.append(text)
            print(f"[{name}] {text}", file=sys.stderr, flush=True)
            found = LISTENING.search(text)
            if found and inst.process is process:
                inst.url = found.group(1)
                self.changed.set()
        code = await process.wait()
        ready.cancel()
        if inst.process is not process:
            return
        inst.failed = not inst.stopping or inst.fail_on_exit  # an exit nobody asked for, or a load that timed out
        inst.exit_code = code
        entry = self.queued(name)
        if entry is not None:
            entry.loading = False  # its waiters see it unloaded: they fail, or the next one loads it again
        inst.process, inst.url, inst.stopping = None, None, False
        self.set_status(name, "unloaded")
        self.tick()

    async def ready_check(self, name: str, process: asyncio.subprocess.Process) -> None:
        """Poll the child's ``/health`` until its model is loaded (then ``loaded``, with its ``/v1/models`` entry);
        a child that takes longer than ``load_timeout`` is stopped."""
        import httpx2 as httpx

        inst = self.table[name]
        deadline = time.monotonic() + self.config.load_timeout
        client = self.http
        while inst.process is process and time.monotonic() < deadline:
            if inst.url is not None:
                try:
                    r = await client.get(inst.url + "/health", timeout=5.0)
                    if r.status_code == 200:
                        m = await client.get(inst.url + "/v1/models", timeout=5.0,
                                             headers={"authorization": f"Bearer {self.key}"})
                        data = m.json().get("data") if m.status_code == 200 else None
                        inst.info = data[0] if isinstance(data, list) and data else {}
                        if inst.process is process and inst.status == "loading":
                            self.set_status(name, "loaded")
                        return
                except (httpx.HTTPError, ValueError):
                    pass
            await asyncio.sleep(0.05)
        if inst.process is process:
            inst.log.append(f"the model did not load in {self.config.load_timeout:g} s")
            inst.fail_on_exit = True
            self.stop(name, force=True)

    def stop(self, name: str, force: bool = False) -> None:
        """Ask the model's child to exit (SIGTERM: it drains its requests); SIGKILL after the model's
        ``stop-timeout``, or at once with ``force`` (a model still loading)."""
        inst = self.table[name]
        process = inst.process
        if process is None or inst.stopping:
            return
        inst.stopping = True
        inst.stops += 1
        self.changed.set()
        if force or inst.status == "loading":
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)

        async def kill_later() -> None:
            await asyncio.sleep(inst.spec.stop_timeout)
            if inst.process is process and process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()

        self.spawn(kill_later())

    async def shutdown(self, grace: float) -> None:
        """Stop every child (SIGTERM, then SIGKILL after ``grace`` seconds) and wait for them."""
        processes = [i.process for i in self.table.values() if i.process is not None]
        for name in list(self.table):
            self.stop(name)
        deadline = time.monotonic() + grace
        for p in processes:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(p.wait(), max(0.1, deadline - time.monotonic()))
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                await p.wait()
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    # --- the hub cache: downloads (POST /models) and removals (DELETE /models) -------------------------------------

    def start_download(self, name: str) -> None:
        """Download ``USER/REPO[:QUANT]`` into the hub cache in the background: ``download_progress`` events
        (``{url: {"done", "total"}}``), then ``download_finished`` (and the list read again) or
        ``download_failed`` with the error."""
        loop = asyncio.get_running_loop()

        def progress(url: str, done: int, total: int) -> None:
            loop.call_soon_threadsafe(self.notify, "download_progress", name, {url: {"done": done, "total": total}})

        async def run() -> None:
            from samplechain.runtime.hub import download_model

            self.notify("model_status", name, {"status": "downloading"})
            try:
                path = await asyncio.to_thread(download_model, name, offline=False, progress=progress)
            except (ValueError, FileNotFoundError, OSError) as e:
                self.notify("download_failed", name, {"error": str(e)})
                return
            finally:
                self.downloads.pop(name, None)
            self.reload()
            self.notify("download_finished", name, {"path": path})

        self.downloads[name] = self.spawn(run())

    async def remove(self, name: str) -> None:
        """Remove a cached model's files (only the hub cache's: a folder's or a preset's model stays); a running
        one is stopped first."""
        inst = self.get(name)
        if inst is not None and inst.spec.source != "cache":
            raise APIError(400, f"model '{name}' is not in the hub cache ({inst.spec.source}): only cached models "
                                "can be removed")
        if inst is not None:
            name = inst.spec.name
            self.stop(name)
            while inst.running:
                await self.wait_change()
        try:
            await asyncio.to_thread(hub_cache.remove_cached, name)
        except FileNotFoundError as e:
            raise APIError(404, str(e), "not_found_error") from None
        self.table.pop(name, None)
        self.queue = collections.deque(e for e in self.queue if e.name != name)
        self.notify("model_remove", name)

    # --- the listing ------------------------------------------------------------------------------------------

    async def refresh_sleeping(self) -> None:
        """Ask each loaded child whether it sleeps (its ``/props``, which does not wake it)."""
        import httpx2 as httpx

        loaded = [i for i in self.table.values() if i.status == "loaded" and i.url is not None]
        if not loaded:
            return

        async def ask(client: Any, inst: Instance) -> None:
            try:
                r = await client.get(inst.url + "/props", headers={"authorization": f"Bearer {self.key}"},
                                     timeout=2.0)
                inst.sleeping = bool(r.json().get("is_sleeping")) if r.status_code == 200 else inst.sleeping
            except (httpx.HTTPError, ValueError, AttributeError):
                pass

        await asyncio.gather(*(ask(self.http, i) for i in loaded))

    def listing(self) -> list[dict[str, Any]]:
        """``/models``' entries (llama-server's ``get_router_models``)."""
        now = int(time.time())
        out = []
        for name, inst in self.table.items():
            if inst.spec.hidden:
                continue
            value = "sleeping" if inst.status == "loaded" and inst.sleeping else inst.status
            status: dict[str, Any] = {"value": value, "args": inst.args}
            if inst.spec.source == "preset":
                status["preset"] = inst.spec.ini()
            if inst.failed:
                status.update(failed=True, exit_code=inst.exit_code)
            aliases = [a.strip() for a in inst.spec.options.get("alias", "").split(",") if a.strip()]
            item: dict[str, Any] = {
                "id": name, "aliases": aliases, "tags": [], "object": "model", "owned_by": "samplechain",
                "created": now, "status": status, "path": inst.spec.path,
                "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
                "source": inst.spec.source, "can_remove": inst.spec.source == "cache"}
            if inst.running:
                for k, v in inst.info.items():
                    item.setdefault(k, v)
            out.append(item)
        return out


def cached_file(repo: str) -> str | None:
    """The file ``-hf repo`` names in the hub cache, or None (``dedup-cache-models``)."""
    from samplechain.runtime.hub import download_model

    try:
        return download_model(repo, offline=True)
    except (ValueError, FileNotFoundError):
        return None


_PRCTL: Any = None  # libc's prctl, looked up in the router (a child between fork and exec imports nothing)


def _parent_death_signal() -> Any:
    """libc's ``prctl`` (Linux), or a function that does nothing."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    return lambda *args: 0


def _die_with_parent() -> None:
    """In the child, before it runs: SIGTERM when the router dies, however it dies (Linux's PR_SET_PDEATHSIG), so
    no model process outlives its router."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)

