"""The Ray Serve deployments behind ``samplechain serve --ray`` (see ``ray_serve``; imports Ray).

``SamplechainEngine``: a replica of ``samplechain serve``: its own ``ServerState`` (model, engine thread, slots and
their prompt cache) and the server's ASGI app, run in-process for each request the front hands it.
``SamplechainFront``: the HTTP ingress: reads the body, picks the conversation's affinity key, calls the engine
through a handle whose ``AffinityRouter`` sends the key to the replica holding it, relays the answer (streams chunk by
chunk), retries a request no replica has accepted yet, and ends a request whose replica died with an error in its
API's shape.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import os
import random
import time
from typing import Any

from ray import serve
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from samplechain.integrations import ray_wire as wire
from samplechain.server.limits import MAX_BODY, APIError
from samplechain.server.relay import RESPONSES_PATHS, StreamTail

logger = logging.getLogger("ray.serve")
ENGINE = "SamplechainEngine"
FRONT = "SamplechainFront"


def keep_grpc_on_loopback() -> None:
    """On a loopback-only node (a local Ray started by ``ray_serve``), bind the replica's inter-deployment gRPC
    server to 127.0.0.1: Serve binds it to ``[::]`` unconditionally, which would listen on every interface. Called
    in a replica's constructor, which runs before Serve starts that server; a no-op on a real cluster."""
    import ray
    from ray.serve._private import replica

    if not ray.util.get_node_ip_address().startswith("127.") or getattr(replica.add_port_to_grpc_server,
                                                                         "samplechain", False):
        return
    original = replica.add_port_to_grpc_server

    def bind(server: Any, address: str) -> Any:
        if address.startswith("[::]:"):
            address = "127.0.0.1:" + address[len("[::]:"):]
        return original(server, address)

    bind.samplechain = True  # type: ignore[attr-defined]
    replica.add_port_to_grpc_server = bind


class AffinityRouter(RequestRouter):
    """Affinity with balance. A conversation's first request goes to the replica with the fewest requests in flight
    (counted here, from routing to completion); the key is remembered (the most recent ``keys`` of them), and every
    later request with that key goes to the same replica: its prompt cache. A keyed or pinned
    (``X-Samplechain-Replica``) request waits for its replica up to ``patience_s`` (Serve's queue-length probe
    gives up after 0.1-1 s on a busy machine, which would scatter a conversation), then spills over to the others
    in rendezvous-hash order (a key forgotten, or its replica gone, is placed again the same way). A request without
    a key: two random replicas, Serve takes the less loaded.

    Pure rendezvous hashing needs no memory, but it spreads new conversations by chance: 16 at once landed 5 and
    11 on two replicas, and the busier one queued while the other idled."""

    def initialize_state(self, patience_s: float = 30.0, keys: int = 65536, **kwargs: Any) -> None:
        self.patience_s = patience_s
        self.max_keys = keys
        self.placed: collections.OrderedDict[str, str] = collections.OrderedDict()  # key -> replica id
        self.in_flight: collections.Counter[str] = collections.Counter()  # replica id -> requests
        self.routed: dict[str, str] = {}  # internal request id -> replica id

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        kwargs = pending_request.kwargs if pending_request is not None else {}
        key, pin = kwargs.get("affinity"), kwargs.get("pin")
        if not key and not pin:
            return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
        ids = {r.replica_id.unique_id: r for r in candidate_replicas}

        def score(r: RunningReplica) -> bytes:
            return hashlib.sha256(f"{key or pin}|{r.replica_id.unique_id}".encode()).digest()

        by_hash = sorted(candidate_replicas, key=score, reverse=True)
        first = ids.get(pin) if pin else None
        if first is None and key:
            first = ids.get(self.placed.get(key, ""))
            if first is None:  # a new conversation (or its replica is gone): the least loaded replica
                first = min(by_hash, key=lambda r: self.in_flight[r.replica_id.unique_id])
            self.placed[key] = first.replica_id.unique_id
            self.placed.move_to_end(key)
            while len(self.placed) > self.max_keys:
                self.placed.popitem(last=False)
        ordered = [first, *(r for r in by_hash if r is not first)] if first is not None else by_hash
        waited = time.time() - pending_request.created_at if pending_request is not None else 0.0
        if waited < getattr(self, "patience_s", 30.0):
            self._count(pending_request, ordered[0])
            return [ordered[:1]]
        return [[r] for r in ordered]

    def _count(self, pending_request: PendingRequest | None, replica: RunningReplica) -> None:
        """The request is counted on the replica it was sent to (a retry of it moves its count)."""
        if pending_request is None:
            return
        request_id = pending_request.metadata.internal_request_id
        previous = self.routed.pop(request_id, None)
        if previous is not None:
            self.in_flight[previous] -= 1
        self.routed[request_id] = replica.replica_id.unique_id
        self.in_flight[replica.replica_id.unique_id] += 1

    def on_request_completed(self, replica_id: Any, internal_request_id: str) -> None:
        counted = self.routed.pop(internal_request_id, None)
        if counted is not None:
            self.in_flight[counted] -= 1
            if self.in_flight[counted] <= 0:
                del self.in_flight[counted]


class SamplechainEngine:
    """One replica of ``samplechain serve`` (its model, engine thread and slots)."""

    def __init__(self, config: Any, load_timeout_s: float = 600.0) -> None:
        import ray

        from samplechain.server.app import Gate, create_app
        from samplechain.server.state import ServerState

        keep_grpc_on_loopback()
        self.state = ServerState(config)
        self.thread = self.state.start()
        self.state.wait(load_timeout_s)
        self.app = Gate(create_app(self.state), self.state)
        context = serve.get_replica_context()
        self.info = {"replica": context.replica_id.unique_id, "node": ray.util.get_node_ip_address(),
                     "pid": os.getpid()}

    async def request(self, request: dict[str, Any], body: bytes, affinity: str | None = None,
                      pin: str | None = None):
        """One HTTP request through this replica's app: its messages (``ray_wire``), streamed."""
        async for message in wire.run_asgi(self.app, request, body, self.info):
            yield message

    def replica_info(self) -> dict[str, Any]:
        return dict(self.info)

    def check_health(self) -> None:
        """Serve's health check: the engine thread runs (a dead one is replaced)."""
        if self.state.failed.is_set():
            raise RuntimeError(f"the model failed to load: {self.state.error}")
        if not self.thread.is_alive():
            raise RuntimeError("the engine thread stopped")

    def __del__(self) -> None:
        state = getattr(self, "state", None)
        if state is not None:
            state.close()


@serve.ingress()
class SamplechainFront:
    """The HTTP ingress (one replica is plenty: it only relays bytes)."""

    def __init__(self, engine: Any, retries: int = 3, start_timeout_s: float = 120.0) -> None:
        keep_grpc_on_loopback()
        self.engine = engine
        self.retries, self.start_timeout_s = retries, start_timeout_s
        self.responses = wire.ResponseMap()

    def __serve_build_asgi_app__(self) -> Any:
        return _ASGI(self.asgi)  # an object with an async __call__: uvicorn would take a bound method for ASGI 2

    async def asgi(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        await self.relay(scope, receive, send)

    async def relay(self, scope: dict, receive: Any, send: Any) -> None:
        path, method = scope["path"], scope["method"]
        headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]]
        named = dict(headers)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > MAX_BODY:
                await _answer(send, *wire.error_response(path, APIError(413, "Payload Too Large")))
                return
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        key = wire.affinity_key(method, path, named, body, self.responses)
        request = {"method": method, "path": path, "headers": headers,
                   "query_string": scope.get("query_string", b"").decode("latin-1"), "client": scope.get("client")}
        pin = named.get(wire.REPLICA_HEADER)
        deadline = time.monotonic() + self.start_timeout_s
        tail = StreamTail(path)
        learn = path.startswith(RESPONSES_PATHS) and method == "POST"
        attempt = 0
        while True:
            replica, started, streaming = None, False, False
            gen = self.engine.options(stream=True).request.remote(request, body, affinity=key, pin=pin)
            try:
                while True:
                    wait = max(0.1, deadline - time.monotonic()) if replica is None else None
                    try:
                        message = await asyncio.wait_for(gen.__anext__(), wait)
                    except StopAsyncIteration:
                        break
                    kind = message[0]
                    if kind == "accepted":
                        replica = message[1]["replica"]
                    elif kind == "start":
                        started = True
                        streaming = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                                        for k, v in message[2])
                        await send({"type": "http.response.start", "status": message[1], "headers": message[2]})
                    else:
                        if learn:
                            self.responses.learn(message[1], key)
                            learn = False
                        if streaming:
                            tail.see(message[1])
                        await send({"type": "http.response.body", "body": message[1], "more_body": message[2]})
                        if not message[2]:
                            return
                if not started:
                    raise RuntimeError("the replica ended the request without an answer")
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            except asyncio.CancelledError:
                gen.cancel()
                raise
            except Exception as e:  # a replica died, was unreachable, or timed out
                gen.cancel()
                if isinstance(e, asyncio.TimeoutError):
                    failure = APIError(503, f"no replica accepted the request within {self.start_timeout_s:g} s",
                                       "unavailable_error")
                elif replica is None and attempt < self.retries and time.monotonic() < deadline:
                    attempt += 1  # nothing ran yet: another replica takes it
                    logger.warning("samplechain: %s %s not started (%s: %s); retry %d", method, path,
                                   type(e).__name__, e, attempt)
                    await asyncio.sleep(min(0.25 * 2 ** attempt, 2.0))
                    continue
                else:
                    logger.warning("samplechain: %s %s failed on replica %s (%s: %s)", method, path, replica,
                                   type(e).__name__, e)
                    where = f" (replica {replica})" if replica else ""
                    failure = APIError(503, f"the replica serving this request failed{where}: "
                                            f"{type(e).__name__}; retry the request", "unavailable_error")
                if not started:
                    await _answer(send, *wire.error_response(path, failure, replica))
                elif streaming:
                    await send({"type": "http.response.body", "body": tail.final_event(failure), "more_body": False})
                else:  # a JSON body cut in the middle: nothing better than ending it
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                return


class _ASGI:
    def __init__(self, call: Any) -> None:
        self.call = call

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        await self.call(scope, receive, send)


async def _answer(send: Any, status: int, headers: list, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
