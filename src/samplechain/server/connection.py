"""Connection timeouts for the HTTP server: uvicorn's h11 protocol with the limits a public listener needs.

uvicorn closes a keep-alive connection idle for 5 s between requests, but nothing else: a client that sends a
request head one byte at a time (slowloris), a body that never ends or a reader that never reads holds its
connection, and with it a task, for ever. This protocol closes a connection whose request head is not complete
``head_timeout`` seconds after it started waiting for one, whose body is not complete ``io_timeout`` seconds
after it started, whose writes stay blocked (the client reads nothing) for
``io_timeout`` seconds (``--timeout``, llama-server's read/write timeout), or that was answered before its body
ended. Any cancelled response then cancels its tasks, as a client that left.

Header names go out in llama-server's spelling (``Content-Type``, ``Access-Control-Allow-Origin``,
``Process-Start-Time-Unix``): ASGI applications and uvicorn give them lowercased, and HTTP says case does not matter,
but clients that look names up case-sensitively break. They are respelled where the bytes are made: the h11
connection that writes each response head.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

TICK = 0.5  # seconds between two checks of a connection's clocks
_SPELLING = {b"etag": b"ETag", b"www-authenticate": b"WWW-Authenticate"}  # where capitalising each word is not it


def header_name(name: bytes) -> bytes:
    """A header name as cpp-httplib / llama-server write it: each dash-separated word capitalised."""
    lower = name.lower()
    return _SPELLING.get(lower) or b"-".join(w[:1].upper() + w[1:] for w in lower.split(b"-"))


class SpelledConnection(h11.Connection):
    """An h11 connection that writes response header names in llama-server's spelling (h11 writes names as given;
    the ones it adds itself, ``Content-Length``, ``Transfer-Encoding``, ``Connection``, it capitalises already)."""

    def send(self, event: Any) -> bytes | None:  # type: ignore[override]
        if isinstance(event, (h11.Response, h11.InformationalResponse)):
            event = type(event)(status_code=event.status_code, reason=event.reason, http_version=event.http_version,
                                headers=[(header_name(n), v) for n, v in event.headers.raw_items()])
        return super().send(event)


class TimedH11Protocol(H11Protocol):
    """``H11Protocol`` with a request-head deadline and read / write timeouts (class attributes, see ``timed``)."""

    head_timeout = 10.0
    io_timeout = 600.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        size = self.config.h11_max_incomplete_event_size
        self.conn = SpelledConnection(h11.SERVER) if size is None else SpelledConnection(h11.SERVER, size)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        now = self.loop.time()
        self._waiting_since = now  # waiting for a request head since
        self._paused_since: float | None = None
        self._body_since: float | None = None  # when the current request's body started
        self._watch_handle: asyncio.TimerHandle | None = self.loop.call_later(TICK, self._watch)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._watch_handle is not None:
            self._watch_handle.cancel()
            self._watch_handle = None
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        self._waiting_since = self.loop.time()
        super().on_response_complete()
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            self.transport.close()  # answered (a 401, a 413) before its body ended: nobody will read the rest

    def pause_writing(self) -> None:
        self._paused_since = self.loop.time()
        super().pause_writing()

    def resume_writing(self) -> None:
        self._paused_since = None
        super().resume_writing()

    def _watch(self) -> None:
        self._watch_handle = None
        if self.transport.is_closing():
            return
        now = self.loop.time()
        their = self.conn.their_state
        if their is h11.IDLE and now - self._waiting_since > self.head_timeout:
            self.transport.close()  # no complete request head in time (a response in progress keeps its state)
            return
        if their is not h11.SEND_BODY:
            self._body_since = None
        elif self._body_since is None:
            self._body_since = now
        elif now - self._body_since > self.io_timeout:
            self.transport.close()  # a body silent, or trickling in, for longer than the timeout
            return
        if self._paused_since is not None and now - self._paused_since > self.io_timeout:
            self.transport.abort()  # its buffered writes would never drain
            return
        self._watch_handle = self.loop.call_later(TICK, self._watch)


def timed(head_timeout: float, io_timeout: float) -> Any:
    """The protocol class for one server's limits (uvicorn takes a class for ``http``)."""
    return type("TimedH11Protocol", (TimedH11Protocol,), {"head_timeout": head_timeout, "io_timeout": io_timeout})
