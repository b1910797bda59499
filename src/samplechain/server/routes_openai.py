"""OpenAI's API: ``/v1/completions``, ``/v1/chat/completions`` and ``/v1/models`` (llama-server's
``server_routes`` handlers, tools/server/server-context.cpp)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from samplechain.runtime.events import Event, Final, Token
from samplechain.server import limits
from samplechain.server import prompts as pr
from samplechain.server import request as rq
from samplechain.server import responses as rs
from samplechain.server.describe import models_body
from samplechain.server.jobs import input_tokens, prepare_chat, prepare_completion
from samplechain.server.responses import reply
from samplechain.server.run import Run, sse_stream

if TYPE_CHECKING:
    from samplechain.server.state import ServerState


def router(state: ServerState) -> APIRouter:
    """The OpenAI-compatible routes over ``state``'s model and engine."""
    routes = APIRouter()
    config = state.config

    @routes.get("/v1/models")
    @routes.get("/models")
    async def models() -> Response:
        with state.loaded() as awake:  # sleeping: as it was on entering sleep (llama-server's cached models)
            return reply(models_body(state) if awake else state.snapshots["models"])

    @routes.post("/v1/completions")
    async def oai_completions(req: Request) -> Response:
        _, opts, todo = await asyncio.to_thread(prepare_completion, state, await rq.read_json(req))
        run = Run(state.running_engine, req.is_disconnected)
        for k, job in enumerate(todo):  # every prompt's choices, in order
            run.submit(job, opts, k)
        cid, model_id = rs.completion_id(), state.model_id
        if not opts.stream:
            finals = await run.finals()
            return reply(rs.oai_completion(finals, cid, model_id))
        await run.started()
        created = int(time.time())

        def frames(index: int, ev: Event) -> list[Any]:
            if not isinstance(ev, (Token, Final)):
                return []
            return [rs.oai_completion_chunk(ev, index, rs.oai_envelope("text_completion", cid, model_id, created))]
        return sse_stream(run, frames, done=True)

    @routes.post("/v1/chat/completions")
    @routes.post("/chat/completions")
    async def chat_completions(req: Request) -> Response:
        body = await rq.read_json(req)
        # templates, tokenizing and grammar compilation off the event loop: other streams keep flowing
        params, opts, todo, chat = await asyncio.to_thread(prepare_chat, state, body)
        tokens = todo[0].tokens
        vocab = state.model.vocab
        with_logprobs = params.n_probs > 0 and bool(body.get("logprobs"))
        run = Run(state.running_engine, req.is_disconnected)
        for k, job in enumerate(todo):
            run.submit(job, opts, k)
        cid, model_id = rs.completion_id(), state.model_id
        if not opts.stream:
            finals = await run.finals()
            out = rs.oai_chat(finals, cid, model_id, chat.syntax, with_logprobs)
            if opts.verbose:
                out["__verbose"] = {"prompt": vocab.detokenize(tokens), "content": finals[0].content}
            return reply(out)
        await run.started()
        stream = rs.ChatStream(cid, model_id, int(time.time()), opts, chat.syntax, with_logprobs)

        return sse_stream(run, stream.chunks, lambda: [stream.usage_chunk()], done=True)

    @routes.post("/v1/chat/completions/input_tokens")
    @routes.post("/chat/completions/input_tokens")
    async def chat_input_tokens(req: Request) -> Response:
        """The number of prompt tokens a chat request's messages make, rendered and tokenized as the chat route
        does (llama-server's token counting; nothing runs)."""
        body = await rq.read_json(req)

        def count() -> int:
            request = pr.tool_request(body)
            if request is not None and request.choice != "none" and body.get("grammar") is not None:
                raise limits.bad_request("Cannot use custom grammar constraints with tools.")
            options = pr.chat_options(body, None, config.reasoning_format)
            return input_tokens(state, pr.chat_messages(body), request, options)
        return reply({"input_tokens": await asyncio.to_thread(count), "object": "response.input_tokens"})

    return routes
