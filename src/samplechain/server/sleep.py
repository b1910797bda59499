"""Sleeping when idle (llama-server's ``--sleep-idle-seconds``): after that many seconds without a request that
uses the model, the engine thread releases the model, its engine and KV cache; the next request that needs the
model loads it again (the startup load, the same settings) and waits for it. Read-only routes (``/health``,
``/props``, ``/metrics``, ``/models``) answer without waking it: from snapshots taken on entering sleep; every
other route wakes it, ``/slots`` and ``POST /props`` too (as llama-server's), but not a path no route answers.

The states, under one lock (``Sleeper``)::

    AWAKE ──idle timer (engine thread)──► GOING_TO_SLEEP ──model released──► SLEEPING
      ▲                                                                      │ a request needs the model
      └───────────── reloaded (waiters go on) ◄──── WAKING ◄─────────────────┘
                      load failed: SLEEPING again, the waiters get a 503 with the error; the next request retries

Only ``AWAKE`` has a model. A request that needs it is counted in flight from the ``Gate`` until its response
has been sent (a stream in progress is busy): the engine sleeps only with nothing in flight, nothing queued or
running, and ``idle_seconds`` since the last request ended. A request arriving in any other state asks for a
wake and waits for it (one reload, whatever the number of waiters). Read-only routes ``pin`` the awake model
for the few microseconds they read it, which holds off the transition but does not count as use.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from samplechain.server.limits import APIError

AWAKE, GOING_TO_SLEEP, SLEEPING, WAKING = "awake", "going to sleep", "sleeping", "waking"

# what answers without the model (llama-server's bypass_sleep routes), besides the web UI's files
MODEL_FREE = frozenset({("GET", "/health"), ("GET", "/v1/health"), ("GET", "/props"), ("GET", "/metrics"),
                        ("GET", "/models"), ("GET", "/v1/models")})
STORED_RESPONSES = ("/v1/responses/", "/responses/")  # GET / DELETE a stored response: the store, not the model


def needs_model(app: Any, scope: dict) -> bool:
    """Whether a request needs the model: not the read-only routes, nor a stored response, nor a path that no
    route answers (a 404 or 405 does not wake the model)."""
    from starlette.routing import Match

    method, path = scope["method"], scope["path"]
    if (method, path) in MODEL_FREE or (method in ("GET", "DELETE") and path.startswith(STORED_RESPONSES)):
        return False
    return any(route.matches(scope)[0] == Match.FULL for route in app.routes)


class Sleeper:
    """The sleep state of one server (see the module): the HTTP side ``enter``s and ``leave``s, the engine thread
    asks ``idle_timer`` when idle, then ``slept``, ``wait_for_wake``, ``woke``."""

    def __init__(self, idle_seconds: float, timeout: float, on_sleep: Callable[[], None],
                 on_wake: Callable[[], None], poke: Callable[[], None]) -> None:
        """``on_sleep``: on the engine thread, under the lock, the model still loaded: take the snapshots;
        ``on_wake``: under the lock, the model loaded again; ``poke``: wake the engine's loop (to re-arm its
        timer); ``timeout``: how long a request waits for the model to wake."""
        self.idle_seconds, self.timeout = idle_seconds, timeout
        self.on_sleep, self.on_wake, self.poke = on_sleep, on_wake, poke
        self.lock = threading.Condition(threading.Lock())
        self.phase = AWAKE
        self.in_flight = 0  # requests that use the model, from the Gate until their response is sent
        self.pins = 0  # read-only routes reading the awake model (no use: the idle timer goes on)
        self.t_idle = time.monotonic()  # when the last request that used the model ended
        self.wake_requested = False
        self.stopping = False  # shutting down: no more sleeping or waking
        self.n_loads = 1  # the model's loads: the startup's, then one per wake
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    @property
    def sleeping(self) -> bool:
        """What ``/props`` says as ``is_sleeping``: from the moment the engine decides to sleep until it is awake
        again."""
        return self.phase != AWAKE

    # --- the HTTP side (the event loop) ---------------------------------------------------------------------------

    async def enter(self) -> None:
        """A request that needs the model: counted in flight; if the model sleeps, it is woken and waited for, at
        most ``timeout`` seconds. APIError 503 when it cannot be (the reload failed, the server shuts down)."""
        with self.lock:
            if self.phase == AWAKE:
                self.in_flight += 1
                return
            if self.stopping:
                raise APIError(503, "the server is shutting down", "unavailable_error")
            self.in_flight += 1
            future = asyncio.get_running_loop().create_future()
            self._waiters.append((asyncio.get_running_loop(), future))
            self.wake_requested = True
            self.lock.notify_all()
        try:
            error = await asyncio.wait_for(future, self.timeout)
        except asyncio.TimeoutError:
            self.leave()
            raise APIError(503, "Loading model: the model did not wake in time", "unavailable_error") from None
        except BaseException:
            self.leave()
            raise
        if error is not None:
            self.leave()
            raise APIError(503, error, "unavailable_error")

    def leave(self) -> None:
        """A request that ``enter``ed has its response sent (or failed)."""
        with self.lock:
            self.in_flight -= 1
            last = self.in_flight == 0
            if last:
                self.t_idle = time.monotonic()
        if last:
            self.poke()  # the engine waits without a timeout while requests are in flight

    @contextlib.contextmanager
    def pinned(self) -> Iterator[bool]:
        """For a read-only route: True, the model is awake and stays so until the block ends; False, it is not
        loaded, and the lock is held until the block ends (the route answers from the snapshots: keep the block
        short, without an ``await``, and call nothing of this object in it)."""
        self.lock.acquire()
        if self.phase != AWAKE:
            try:
                yield False
            finally:
                self.lock.release()
            return
        self.pins += 1
        self.lock.release()
        try:
            yield True
        finally:
            with self.lock:
                self.pins -= 1

    # --- the engine thread --------------------------------------------------------------------------------------

    def idle_timer(self) -> float:
        """The engine is idle (nothing running, queued or in its inbox): the seconds it may wait before asking
        again (``math.inf``: until poked); 0: it sleeps now (the snapshots are taken, the phase is
        GOING_TO_SLEEP)."""
        with self.lock:
            if self.stopping or self.in_flight:
                return math.inf
            if self.pins:
                return 0.01
            left = self.t_idle + self.idle_seconds - time.monotonic()
            if left > 0:
                return left
            self.on_sleep()
            self.phase = GOING_TO_SLEEP
            return 0.0

    def slept(self) -> None:
        """The model and its engine are released."""
        with self.lock:
            self.phase = SLEEPING

    def wait_for_wake(self) -> bool:
        """Until a request needs the model (True: the phase is WAKING, load it) or the server stops (False)."""
        with self.lock:
            while not self.wake_requested and not self.stopping:
                self.lock.wait()
            if self.stopping:
                return False
            self.phase = WAKING
            return True

    def woke(self, error: str | None) -> bool:
        """The reload is done: awake, or (``error``) still sleeping; either way the waiters go on. False: the
        server is stopping (it stays asleep)."""
        with self.lock:
            self.wake_requested = False
            if self.stopping:
                self.phase = SLEEPING
                return False
            if error is None:
                self.on_wake()
                self.phase = AWAKE
                self.n_loads += 1
                self.t_idle = time.monotonic()
            else:
                self.phase = SLEEPING
            waiters, self._waiters = self._waiters, []
        _resolve_all(waiters, error)
        return True

    def stop(self) -> None:
        """Shutting down: no more sleeping; a sleeping engine thread ends; the waiters get a 503."""
        with self.lock:
            self.stopping = True
            waiters, self._waiters = self._waiters, []
            self.lock.notify_all()
        _resolve_all(waiters, "the server is shutting down")


def _resolve_all(waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]], error: str | None) -> None:
    for loop, future in waiters:
        with contextlib.suppress(RuntimeError):  # its loop is closed
            loop.call_soon_threadsafe(_resolve, future, error)


def _resolve(future: asyncio.Future, error: str | None) -> None:
    if not future.done():  # not timed out or cancelled meanwhile
        future.set_result(error)
