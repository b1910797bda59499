"""What the Ray Serve deployments pass between them, without Ray: a request's affinity key (from its body), one ASGI
request run in-process on a replica (its messages as plain tuples), the replica's name on ``/health``, ``/slots`` and
``/metrics``, and an error in the API's own shape when a replica dies (a JSON body, or a stream's final event).

Messages from a replica to the front, in order: ``("accepted", info)`` as soon as the replica has the request (before
it is that, a failure is retried on another replica), ``("start", status, headers)``, then ``("body", bytes,
more)`` until ``more`` is false.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Any

from samplechain.server import relay
from samplechain.server.limits import APIError
from samplechain.server.relay import RESPONSE_ID, RESPONSES_PATHS
from samplechain.server.responses import json_bytes

REPLICA_HEADER = "x-samplechain-replica"  # on every answer: the replica that answered (also a request's pin)
CONVERSATION_HEADER = "x-conversation-id"  # an explicit conversation: its turns go to one replica
PREFIX_CHARS = 512  # a raw prompt's affinity: its first characters (a later turn appends to the prompt)


# --- affinity: which conversation a request continues ----------------------------------------------------------


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _first(items: Any, role: str) -> Any:
    if isinstance(items, list):
        for m in items:
            if isinstance(m, dict) and m.get("role") == role:
                return m.get("content")
    return None


def affinity_key(method: str, path: str, headers: dict[str, str], body: bytes,
                 responses: ResponseMap | None = None) -> str | None:
    """The key that keeps a conversation on one replica, or None (any replica, the least loaded). In order: the
    ``X-Conversation-Id`` header; a stored response (``previous_response_id``, ``/v1/responses/{id}``: the replica
    that keeps it); the body's ``user`` (OpenAI) or ``metadata.user_id`` (Anthropic); else the conversation's prefix:
    the system prompt and first user message of ``messages`` (Chat Completions, Anthropic Messages), the
    ``instructions`` and first input item (Responses), the first characters of a raw ``prompt``."""
    conversation = headers.get(CONVERSATION_HEADER)
    if conversation:
        return "conversation:" + _digest(conversation)
    if responses is not None and path.startswith(RESPONSES_PATHS) and method in ("GET", "DELETE"):
        return responses.get(path.rstrip("/").rsplit("/", 1)[-1])
    if method != "POST" or not body:
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    previous = data.get("previous_response_id")
    if responses is not None and isinstance(previous, str) and responses.get(previous) is not None:
        return responses.get(previous)
    user = data.get("user")
    if not user and isinstance(data.get("metadata"), dict):
        user = data["metadata"].get("user_id")
    if isinstance(user, str) and user:
        return "user:" + _digest(user)
    messages = data.get("messages")
    if isinstance(messages, list) and messages:
        system = data.get("system") if "system" in data else _first(messages, "system")
        return "prefix:" + _digest(system, _first(messages, "user"))
    if "input" in data and path.startswith(RESPONSES_PATHS):
        given = data["input"]
        first = given[0] if isinstance(given, list) and given else given
        return "prefix:" + _digest(data.get("instructions"), first)
    prompt = data.get("prompt", data.get("content"))
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return "prefix:" + _digest(prompt[:PREFIX_CHARS])
    return None


class ResponseMap:
    """Responses API ids -> the affinity key of the request that made them (the replica that stores them), so
    ``previous_response_id`` and ``GET /v1/responses/{id}`` reach it; the least recently used are dropped."""

    ID = RESPONSE_ID

    def __init__(self, size: int = 4096) -> None:
        self.size, self.keys = size, OrderedDict[str, str]()

    def get(self, rid: str) -> str | None:
        key = self.keys.get(rid)
        if key is not None:
            self.keys.move_to_end(rid)
        return key

    def learn(self, chunk: bytes, key: str | None) -> str | None:
        """Remember the first response id in ``chunk`` (a JSON body, or a stream's ``response.created``)."""
        found = self.ID.search(chunk)
        if found is None or key is None:
            return None
        rid = found.group(1).decode()
        self.keys[rid] = key
        self.keys.move_to_end(rid)
        while len(self.keys) > self.size:
            self.keys.popitem(last=False)
        return rid


# --- failures in the API's shape ---------------------------------------------------------------------------------


def error_response(path: str, e: APIError, replica: str | None = None) -> tuple[int, list[tuple[bytes, bytes]],
                                                                                 bytes]:
    """An error answer before anything was sent, naming the replica that answered it."""
    return relay.error_response(path, e, [(REPLICA_HEADER.encode(), replica.encode())] if replica else [])


# --- one ASGI request, run in-process on a replica ---------------------------------------------------------------


def _json_patch(path: str, body: bytes, info: dict[str, Any]) -> bytes:
    """``/health``: the replica's name, node and pid beside ``status``; ``/slots``: each slot names its replica."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    if isinstance(data, dict) and path.endswith("/health"):
        data.update(info)
    elif isinstance(data, list) and path == "/slots":
        for slot in data:
            if isinstance(slot, dict):
                slot["replica"] = info["replica"]
    else:
        return body
    return json_bytes(data)


def _metrics_patch(body: bytes, info: dict[str, Any]) -> bytes:
    return body + (f"# HELP samplechain:replica_info The Ray Serve replica that answered.\n"
                   f"# TYPE samplechain:replica_info gauge\n"
                   f'samplechain:replica_info{{replica="{info["replica"]}",node="{info["node"]}",'
                   f'pid="{info["pid"]}"}} 1\n').encode()


PATCHED = ("/health", "/v1/health", "/slots", "/metrics")


async def run_asgi(app: Callable, request: dict[str, Any], body: bytes,
                   info: dict[str, Any]) -> AsyncIterator[tuple]:
    """Run one HTTP request through ``app`` in this process and yield its messages (see the module). ``request``:
    method, path, query_string, headers (pairs of str), client. Closing the generator early (the client left) is an
    ``http.disconnect`` for the app, which cancels the request's work."""
    yield ("accepted", info)
    path = request["path"]
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": request["method"], "scheme": "http", "path": path, "raw_path": path.encode(),
             "root_path": "", "query_string": request.get("query_string", "").encode("latin-1"),
             "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in request["headers"]],
             "client": tuple(request["client"]) if request.get("client") else None,
             "server": ("127.0.0.1", 80), "state": {}}
    queue: asyncio.Queue[dict | None] = asyncio.Queue()
    gone = asyncio.Event()
    sent_body = False

    async def receive() -> dict:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        await queue.put(message)

    async def call() -> None:
        try:
            await app(scope, receive, send)
        finally:
            await queue.put(None)

    task = asyncio.create_task(call())
    patch = path in PATCHED and request["method"] == "GET"
    held: list[bytes] = []
    start: dict | None = None
    name = (REPLICA_HEADER.encode(), str(info["replica"]).encode())
    try:
        while True:
            message = await queue.get()
            if message is None:
                break
            if message["type"] == "http.response.start":
                headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
                start = {"status": message["status"], "headers": [*headers, name]}
                if not patch:
                    yield ("start", start["status"], start["headers"])
            elif message["type"] == "http.response.body":
                chunk, more = bytes(message.get("body", b"")), bool(message.get("more_body", False))
                if patch:
                    held.append(chunk)
                    if not more:
                        break
                    continue
                yield ("body", chunk, more)
                if not more:
                    break
        if patch and start is not None:
            whole = b"".join(held)
            if start["status"] == 200:
                whole = _metrics_patch(whole, info) if path == "/metrics" else _json_patch(path, whole, info)
            headers = [(k, str(len(whole)).encode() if k.lower() == b"content-length" else v)
                       for k, v in start["headers"]]
            yield ("start", start["status"], headers)
            yield ("body", whole, False)
        if task.done() and task.exception() is not None and start is None:
            raise task.exception()
    finally:
        gone.set()
        if not task.done():
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(task), 5)
            task.cancel()
