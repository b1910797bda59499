"""Anthropic's Messages API: ``/v1/messages`` and ``/v1/messages/count_tokens`` (also without ``/v1``), over the
same chat layer and engine as the OpenAI chat route (llama.cpp's ``post_anthropic_messages`` and
``post_anthropic_count_tokens`` in ``tools/server/server-context.cpp``). The wire translation is in
``anthropic_wire``; errors on these paths are answered in Anthropic's shape by the app (``responses.error_body``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from samplechain.chat import ChatParams
from samplechain.runtime.events import Error, Final, Progress, Token
from samplechain.server import anthropic_wire as wire
from samplechain.server import request as rq
from samplechain.server.jobs import Job, input_tokens, prepare_messages
from samplechain.server.request import Options
from samplechain.server.responses import error_event, reply
from samplechain.server.run import Run, streaming

if TYPE_CHECKING:
    from samplechain.server.state import ServerState

PING_SECONDS = 5.0  # a stream that has sent nothing for this long sends a ping (a long prompt being read)


def router(state: ServerState) -> APIRouter:
    """The Messages routes over ``state``'s model and engine."""
    routes = APIRouter()

    def prepare(body: dict[str, Any]) -> tuple[wire.Translated, Options, Job, ChatParams]:
        """The request's one task, its options and its chat parameters. A ``max_tokens`` past what the slot's
        context leaves after the prompt is capped to it (Claude Code asks for 32000 whatever the context)."""
        t = wire.translate(body, state.config.reasoning_format)
        _, opts, todo, chat = prepare_messages(state, t.fields, t.messages, t.request, t.options)
        room = state.running_engine.n_ctx_slot - len(todo[0].tokens)
        rules = replace(opts.rules, n_predict=min(opts.rules.n_predict, room))
        return t, replace(opts, rules=rules, return_progress=True), todo[0], chat

    @routes.post("/v1/messages")
    @routes.post("/messages")
    async def messages(req: Request) -> Response:
        body = await rq.read_json(req)
        model = body["model"] if isinstance(body.get("model"), str) else state.model_id
        # templates, tokenizing and grammar compilation off the event loop: other streams keep flowing
        t, opts, job, chat = await asyncio.to_thread(prepare, body)
        run = Run(state.running_engine, req.is_disconnected)
        run.submit(job, opts, 0)
        mid = wire.message_id()
        if not opts.stream:
            [final] = await run.finals()
            return reply(wire.message(final, chat.syntax, mid, model, t.stops))
        await run.started()
        writer = wire.EventWriter(mid, model, chat.syntax, t.stops)
        return streaming(message_events(run, writer, len(job.tokens)), run)

    @routes.post("/v1/messages/count_tokens")
    @routes.post("/messages/count_tokens")
    async def count_tokens(req: Request) -> Response:
        """The prompt tokens the same request would use, rendered and tokenized as ``messages`` does (llama.cpp's
        ``handle_count_tokens``, ``jobs.input_tokens``); nothing runs and ``max_tokens`` is not required."""
        body = await rq.read_json(req)

        def count() -> int:
            t = wire.translate(body, state.config.reasoning_format, count=True)
            return input_tokens(state, t.messages, t.request, t.options)
        return reply({"input_tokens": await asyncio.to_thread(count)})

    return routes


async def message_events(run: Run, writer: wire.EventWriter, n_prompt: int) -> AsyncIterator[bytes]:
    """A started run's events as Anthropic's stream. ``message_start`` waits for the prompt's first progress event
    (it says how much of the prompt is cached), then a ``ping`` whenever nothing was sent for ``PING_SECONDS``
    (llama-server's ``sse_ping_interval`` sends comments): the read of the next event is one task that a ping never
    cancels. An engine error ends the stream with an ``error`` event."""
    loop = asyncio.get_running_loop()
    source = run.events()
    pending: asyncio.Future | None = None
    started = False
    last = loop.time()
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(source))
            timeout = max(last + PING_SECONDS - loop.time(), 0.0) if started else None
            done, _ = await asyncio.wait((pending,), timeout=timeout)
            if not done:
                last = loop.time()
                yield wire.PING
                continue
            try:
                _, ev = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            out = b""
            if not started:
                started = True
                out = writer.start(n_prompt, ev.cache if isinstance(ev, Progress) else 0)
            if isinstance(ev, Error):
                yield out + wire.error_event(error_event(ev))
                return
            if isinstance(ev, Token):
                out += writer.token(ev.text)
            elif isinstance(ev, Final):
                out += writer.finish(ev)
            if out:
                last = loop.time()
                yield out
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
