"""OpenAI's Responses API: ``POST /v1/responses`` (and ``/responses``), ``GET`` / ``DELETE /v1/responses/{id}``.

A request is translated to the chat layer's messages, tools and options (``responses_wire``, after llama.cpp's
``server_chat_convert_responses_to_chatcmpl``, tools/server/server-chat.cpp) and runs as a chat completion does
(``jobs.prepare_messages``); the answer is read by the chat layer and written as Responses output items, whole or
as the event stream of llama.cpp's ``to_json_oaicompat_resp`` (server-task.cpp), with OpenAI's sequence numbers,
output and content indexes. Responses are kept for ``previous_response_id`` unless ``store`` is false.

Departure from llama-server: an answer cut at ``max_output_tokens`` (or the context) is OpenAI's ``incomplete``
response (``status: incomplete``, ``incomplete_details.reason: max_output_tokens``, the message item
``incomplete``; streamed, ``response.incomplete`` is the last event), where llama-server says ``completed`` and
ends every stream with ``response.completed``: a client can tell a cut answer from a finished one, as with OpenAI."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from samplechain.chat import ChatOptions, ChatParams, ChatSyntax, MessageDiff, MessageStream, ToolRequest
from samplechain.grammar.json_schema import server_response_schema
from samplechain.params import SamplingParams
from samplechain.runtime.events import Error, Final, Progress, Token
from samplechain.server import limits
from samplechain.server import prompts as pr
from samplechain.server import request as rq
from samplechain.server import responses_wire as rw
from samplechain.server.jobs import Job, input_tokens, prepare_messages
from samplechain.server.request import Options
from samplechain.server.responses import json_bytes, parse_final, prompt_progress, reply
from samplechain.server.run import Run, streaming

if TYPE_CHECKING:
    from samplechain.server.state import ServerState


@dataclass
class Prepared:
    """A Responses request ready to run: its tasks, how to read its answer, and what it echoes and stores."""

    params: SamplingParams
    opts: Options
    jobs: list[Job]
    chat: ChatParams
    settings: rw.Settings
    history: list[dict[str, Any]]  # the conversation without the instructions (stored with the answer)
    items: dict[str, dict[str, Any]]  # the input items that have ids (item_reference)


@dataclass
class ChatInputs:
    """A Responses request as the chat layer's inputs (``translate``)."""

    conversation: list[dict[str, Any]]  # the input items after the previous response's conversation
    messages: list[dict[str, Any]]  # the same after the instructions
    tools: list[dict[str, Any]]
    request: ToolRequest | None
    fields: dict[str, Any]  # llama-server's sampling fields
    options: ChatOptions


def translate(state: ServerState, body: dict[str, Any]) -> ChatInputs:
    """The request as the chat layer's inputs: input items after the previous response's conversation, the
    instructions first, function tools, ``text.format``, ``reasoning`` and the sampling fields."""
    rw.validate_settings(body)
    store = state.responses
    previous: list[dict[str, Any]] = []
    prev_id = body.get("previous_response_id")
    if prev_id:
        stored = store.get(prev_id)
        if stored is None:
            raise rw.not_found(prev_id, "previous_response_id")
        previous = stored.history
    n_ctx = state.running_engine.n_ctx_slot
    conversation = pr.chat_messages({"messages": rw.input_messages(body, previous, store)})
    instructions = body.get("instructions")
    messages = [{"role": "system", "content": instructions}, *conversation] if instructions else conversation
    tools = rw.function_tools(body)
    request = pr.tool_request(rw.tool_body(body, tools))
    schema = rw.text_schema(body)
    fields = rw.sampling_fields(body, n_ctx, schema)
    if request is not None and request.choice != "none" and fields.get("grammar") is not None:
        raise limits.bad_request("Cannot use custom grammar constraints with tools.")
    options = pr.chat_options(rw.thinking_options(body), None if schema is None else server_response_schema(schema),
                              state.config.reasoning_format)
    return ChatInputs(conversation, messages, tools, request, fields, options)


def prepare(state: ServerState, body: dict[str, Any]) -> Prepared:
    """The request through the chat layer (off the event loop, ``translate``), ready to run."""
    t = translate(state, body)
    params, opts, todo, chat = prepare_messages(state, t.fields, t.messages, t.request, t.options)
    model = body.get("model") if isinstance(body.get("model"), str) and body.get("model") else state.model_id
    settings = rw.Settings(model, t.tools, body, params.temperature, params.top_p)
    inputs = body.get("input") if isinstance(body.get("input"), list) else []
    items = {item["id"]: item for item in inputs if isinstance(item.get("id"), str) and item.get("type") !=
             "item_reference"}
    return Prepared(params, opts, todo, chat, settings, t.conversation, items)


def keep(state: ServerState, p: Prepared, response: dict[str, Any]) -> None:
    """A finished response into the store (unless ``store: false``): its object, its conversation and its items."""
    if p.settings.body.get("store") is False:
        return
    history = rw.answered(p.history, rw.assistant_message(response["output"]))
    items = {**p.items, **{item["id"]: item for item in response["output"]}}
    state.responses.put(response["id"], rw.Stored(response, history, items))


def count_tokens(state: ServerState, text: str) -> int:
    return len(state.model.tokenize(text, add_special=False, parse_special=False)) if text else 0


class ResponseStream:
    """A streamed response's server-sent events (``event: <type>`` + ``data:``, each with its ``sequence_number``):
    ``response.created`` and ``response.in_progress``, each output item as it grows (reasoning text, output text,
    function call arguments: ``output_item.added``, its deltas, its ``.done`` events, ``output_item.done``), then
    ``response.completed`` / ``response.incomplete`` with the whole response, or ``error`` + ``response.failed``.
    After llama.cpp's ``server_task_result_cmpl_partial::to_json_oaicompat_resp`` (server-task.cpp)."""

    def __init__(self, settings: rw.Settings, rid: str, created: int, syntax: ChatSyntax, opts: Options) -> None:
        self.settings, self.rid, self.created, self.opts = settings, rid, created, opts
        self.parser = MessageStream(syntax)
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # the output items so far
        self.open: int | None = None  # the index of the item being written
        self.calls: dict[int, int] = {}  # a tool call's index -> its item's index
        self.status = "in_progress"

    def event(self, kind: str, **data: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + json_bytes(payload) + b"\n\n"

    def response(self, status: str, use: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.settings.response(self.rid, self.created, status, self.items, use)

    def start(self) -> bytes:
        return (self.event("response.created", response=self.response("in_progress"))
                + self.event("response.in_progress", response=self.response("in_progress")))

    def progress(self, ev: Progress) -> bytes:
        """Prompt reading (``return_progress``): an ``in_progress`` event with ``prompt_progress``, as llama.cpp."""
        return self.event("response.in_progress", response=self.response("in_progress"),
                          prompt_progress=prompt_progress(ev))

    def token(self, ev: Token) -> bytes:
        out = self.diffs(self.parser.update(ev.text))
        if out and self.opts.timings_per_token:  # the token's timings ride on its last event (llama.cpp)
            out[-1] = self.event_with(out[-1], timings=ev.timings)
        return b"".join(self.encode(out))

    def finish(self, final: Final, reasoning_tokens: Any) -> tuple[bytes, dict[str, Any]]:
        """The rest of the answer, every open item closed, and the last event; the whole response."""
        parts = self.diffs(self.parser.update("", final=True))
        self.status = "completed" if final.stop_type in ("eos", "word") else "incomplete"
        parts += self.close()
        msg = self.parser.msg
        response = self.response(self.status, rw.usage(final, reasoning_tokens(msg.reasoning_content)))
        parts.append(("response." + self.status, {"response": response, "timings": final.timings}))
        return b"".join(self.encode(parts)), response

    def fail(self, ev: Error) -> bytes:
        parts = self.close()
        parts.append(("error", {"code": ev.error_type, "message": ev.message, "param": None}))
        response = self.response("failed")
        response["error"] = {"code": "server_error", "message": ev.message}
        parts.append(("response.failed", {"response": response}))
        return b"".join(self.encode(parts))

    # events are built as (type, data) pairs, numbered when encoded (in order)
    @staticmethod
    def event_with(part: tuple[str, dict[str, Any]], **extra: Any) -> tuple[str, dict[str, Any]]:
        return part[0], {**part[1], **extra}

    def encode(self, parts: list[tuple[str, dict[str, Any]]]) -> list[bytes]:
        return [self.event(kind, **data) for kind, data in parts]

    def diffs(self, diffs: list[MessageDiff]) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        for d in diffs:
            if d.reasoning:
                out += self.write("reasoning", d.reasoning)
            elif d.content:
                out += self.write("message", d.content)
            elif d.tool_index >= 0:
                out += self.call(d)
        return out

    def begin(self, item: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """A new output item (the open one closed first)."""
        out = self.close()
        self.items.append(item)
        self.open = len(self.items) - 1
        out.append(("response.output_item.added", {"output_index": self.open, "item": dict(item, content=[])
                                                   if "content" in item else dict(item)}))
        if item["type"] == "message":
            out.append(("response.content_part.added", {"item_id": item["id"], "output_index": self.open,
                                                        "content_index": 0, "part": rw.text_part("")}))
        elif item["type"] == "reasoning":
            out.append(("response.content_part.added", {"item_id": item["id"], "output_index": self.open,
                                                        "content_index": 0,
                                                        "part": {"type": "reasoning_text", "text": ""}}))
        return out

    def write(self, kind: str, text: str) -> list[tuple[str, dict[str, Any]]]:
        """Reasoning or output text: into the open item of its kind, or a new one."""
        out: list[tuple[str, dict[str, Any]]] = []
        if self.open is None or self.items[self.open]["type"] != kind:
            item = (rw.reasoning_item(rw.new_id("rs_"), "", "in_progress") if kind == "reasoning"
                    else rw.message_item(rw.new_id("msg_"), "", "in_progress"))
            out += self.begin(item)
        item = self.items[self.open]
        item["content"][0]["text"] += text
        where = {"item_id": item["id"], "output_index": self.open, "content_index": 0, "delta": text}
        if kind == "reasoning":
            out.append(("response.reasoning_text.delta", where))
        else:
            out.append(("response.output_text.delta", {**where, "logprobs": []}))
        return out

    def call(self, d: MessageDiff) -> list[tuple[str, dict[str, Any]]]:
        """A tool call's first piece (a new function_call item) or more of its arguments."""
        out: list[tuple[str, dict[str, Any]]] = []
        if d.header and d.tool_index not in self.calls:
            fid, call_id = rw.call_ids(d.tool_id)
            out += self.begin(rw.call_item(fid, call_id, d.tool_name, "", "in_progress"))
            self.calls[d.tool_index] = self.open
        index = self.calls.get(d.tool_index)
        if index is None or not d.tool_arguments:
            return out
        item = self.items[index]
        item["arguments"] += d.tool_arguments
        out.append(("response.function_call_arguments.delta", {"item_id": item["id"], "output_index": index,
                                                               "delta": d.tool_arguments}))
        return out

    def close(self) -> list[tuple[str, dict[str, Any]]]:
        """The open item's ``.done`` events."""
        if self.open is None:
            return []
        index, item = self.open, self.items[self.open]
        self.open = None
        where = {"item_id": item["id"], "output_index": index}
        kind = item["type"]
        item["status"] = "incomplete" if kind == "message" and self.status == "incomplete" else "completed"
        out: list[tuple[str, dict[str, Any]]] = []
        if kind == "function_call":
            out.append(("response.function_call_arguments.done", {**where, "name": item["name"],
                                                                  "arguments": item["arguments"]}))
        else:
            part = item["content"][0]
            if kind == "message":
                out.append(("response.output_text.done", {**where, "content_index": 0, "text": part["text"],
                                                          "logprobs": []}))
            else:
                out.append(("response.reasoning_text.done", {**where, "content_index": 0, "text": part["text"]}))
            out.append(("response.content_part.done", {**where, "content_index": 0, "part": part}))
        out.append(("response.output_item.done", {"output_index": index, "item": item}))
        return out


def router(state: ServerState) -> APIRouter:
    """The Responses routes over ``state``'s model and engine."""
    routes = APIRouter()

    def reasoning_tokens(text: str) -> int:
        return count_tokens(state, text)

    @routes.post("/v1/responses")
    @routes.post("/responses")
    async def create_response(req: Request) -> Response:
        body = await rq.read_json(req)
        p = await asyncio.to_thread(prepare, state, body)
        run = Run(state.running_engine, req.is_disconnected)
        for k, job in enumerate(p.jobs):
            run.submit(job, p.opts, k)
        rid, created = rw.new_id("resp_"), int(time.time())
        if not p.opts.stream:
            final = (await run.finals())[0]

            def whole() -> dict[str, Any]:  # parsing and counting the reasoning's tokens: off the event loop
                msg = parse_final(final.content, p.chat.syntax)
                done = final.stop_type in ("eos", "word")
                return p.settings.response(rid, created, "completed" if done else "incomplete",
                                           rw.output_items(msg, not done),
                                           rw.usage(final, reasoning_tokens(msg.reasoning_content)))
            response = await asyncio.to_thread(whole)
            keep(state, p, response)
            return reply(response)
        await run.started()
        stream = ResponseStream(p.settings, rid, created, p.chat.syntax, p.opts)

        async def events() -> AsyncIterator[bytes]:
            yield stream.start()
            final = None
            async for _, ev in run.events():
                if isinstance(ev, Error):  # also after the final event: a stream cut at shutdown fails
                    yield stream.fail(ev)
                    return
                if isinstance(ev, Progress):
                    yield stream.progress(ev)
                elif isinstance(ev, Token):
                    chunk = stream.token(ev)
                    if chunk:
                        yield chunk
                elif isinstance(ev, Final):
                    final = ev
            if final is not None:  # the last parse and the reasoning's tokens counted off the event loop
                chunk, response = await asyncio.to_thread(stream.finish, final, reasoning_tokens)
                keep(state, p, response)
                yield chunk
        return streaming(events(), run)

    @routes.post("/v1/responses/input_tokens")
    @routes.post("/responses/input_tokens")
    async def response_input_tokens(req: Request) -> Response:
        """The prompt tokens the same request would use (llama-server's ``post_responses_tok_oai``): rendered and
        tokenized as ``create_response`` does; nothing runs."""
        body = await rq.read_json(req)

        def count() -> int:
            t = translate(state, body)
            return input_tokens(state, t.messages, t.request, t.options)
        return reply({"input_tokens": await asyncio.to_thread(count), "object": "response.input_tokens"})

    @routes.get("/v1/responses/{rid}")
    @routes.get("/responses/{rid}")
    async def get_response(rid: str) -> Response:
        stored = state.responses.get(rid)
        if stored is None:
            raise rw.not_found(rid)
        return reply(stored.response)

    @routes.delete("/v1/responses/{rid}")
    @routes.delete("/responses/{rid}")
    async def delete_response(rid: str) -> Response:
        if not state.responses.delete(rid):
            raise rw.not_found(rid)
        return reply({"id": rid, "object": "response", "deleted": True})

    return routes
