"""A request's tasks in flight: submitted to the engine, their events read back on the event loop (from the
engine thread through ``call_soon_threadsafe``), and cancelled when the client leaves."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import replace
from typing import Any

from fastapi.responses import StreamingResponse

from samplechain.runtime.events import Begin, Embeddings, Error, Event, Final
from samplechain.server.engine import Engine
from samplechain.server.jobs import Job
from samplechain.server.request import Options
from samplechain.server.responses import error_event, sse
from samplechain.server.slot import Task


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
        self.queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self.tasks: list[Task] = []
        self.backlog: deque[tuple[int, Event]] = deque()  # read while waiting for the slots, not yet used
        self._read: asyncio.Future | None = None
        self._next_poll = self.loop.time() + DISCONNECT_POLL  # when to check the client's connection next

    def submit(self, job: Job, opts: Options, index: int) -> None:
        self.add(Task(tokens=job.tokens, params=job.params, emit=self.emitter(index), rules=opts.rules,
                      cache_prompt=opts.cache_prompt, id_slot=opts.id_slot,
                      return_progress=opts.return_progress and opts.stream, sampler=job.sampler))

    def emitter(self, index: int) -> Callable[[Event], None]:
        """The ``emit`` of this request's task ``index``: its events into the queue, from the engine thread."""
        def emit(ev: Event) -> None:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (index, ev))
        return emit

    def add(self, task: Task) -> None:
        """Submit a task made with ``emitter`` (an embedding task; ``submit`` makes completion tasks)."""
        self.tasks.append(task)
        self.engine.submit(task)

    def cancel(self) -> None:
        for t in self.tasks:
            if not t.cancelled.is_set():
                self.engine.cancel(t)
        if self._read is not None:
            self._read.cancel()
            self._read = None

    async def next(self) -> tuple[int, Event]:
        """A stream's next event: the backlog's first, else the queue's."""
        if self.backlog:
            return self.backlog.popleft()
        return await self.receive(watch=False)

    async def receive(self, watch: bool = True) -> tuple[int, Event]:
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
        await self._gather(Begin, keep=True)

    async def events(self) -> AsyncIterator[tuple[int, Event]]:
        """Every event until each task has its final (or error) event. A task cut short (the server shutting
        down) gives its final event, then its error."""
        open_tasks = len(self.tasks)
        while open_tasks:
            index, ev = await self.next()
            if isinstance(ev, Begin):
                continue
            if isinstance(ev, Error) and ev.final is not None:
                yield index, ev.final
                ev = replace(ev, final=None)
            if isinstance(ev, (Final, Error)):
                open_tasks -= 1
            yield index, ev

    async def finals(self, kind: type[Final | Embeddings] = Final) -> list[Any]:
        """Wait for every final result (non-streaming: ``Final``, or ``Embeddings`` for embedding tasks); the
        client leaving cancels the tasks (``ClientGone``), and so does an error (raised as the error it answers)."""
        finals = await self._gather(kind, keep=False)
        return [finals[i] for i in sorted(finals)]

    async def _gather(self, kind: type[Begin | Final | Embeddings], keep: bool) -> dict[int, Event]:
        """Read until every task has sent a ``kind`` event; an error raises (and cancels the tasks); other events
        go to the backlog when ``keep``."""
        got: dict[int, Event] = {}
        try:
            while len(got) < len(self.tasks):
                index, ev = await self.receive()
                if isinstance(ev, Error):
                    raise error_event(ev)
                if isinstance(ev, kind):
                    got[index] = ev
                elif keep:  # a task is generating: the stream starts (the others may still wait for a slot)
                    self.backlog.append((index, ev))
                    break
        except BaseException:
            self.cancel()
            raise
        return got


def streaming(gen: AsyncIterator[bytes], run: Run) -> StreamingResponse:
    """A server-sent-events response of ``gen``'s chunks; its end, or its client leaving, cancels ``run``'s tasks."""

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in gen:
                yield chunk
        finally:
            run.cancel()  # the client went away (or the stream ended: then nothing is running)
    return StreamingResponse(body(), media_type="text/event-stream", headers={"X-Accel-Buffering": "no"})


def sse_stream(run: Run, frames: Callable[[int, Event], Iterable[Any]], end: Callable[[], Iterable[Any]] = tuple,
               done: bool = False) -> StreamingResponse:
    """A run's server-sent events: each event's frames (``frames(index, event)``; None frames are skipped), an
    error as the stream's last frame; at the end the ``end`` frames, then OpenAI's ``data: [DONE]`` when ``done``.
    The route's streaming answer (``streaming``: its end or its client leaving cancels the run)."""

    async def events() -> AsyncIterator[bytes]:
        async for index, ev in run.events():
            if isinstance(ev, Error):
                yield sse(error_event(ev).body())
                return
            out = [f for f in frames(index, ev) if f is not None]
            if out:
                yield b"".join(map(sse, out))
        for frame in end():
            if frame is not None:
                yield sse(frame)
        if done:
            yield b"data: [DONE]\n\n"
    return streaming(events(), run)
