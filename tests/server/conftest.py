"""Live servers on loopback (uvicorn in a thread, any free port) over the session's SmolLM2."""

import contextlib
import threading
import time

import pytest

from samplechain.params import SamplingParams
from samplechain.server.app import Gate, ServerConfig, ServerState, create_app
from samplechain.server.request import Defaults


class LiveServer:
    def __init__(self, config: ServerConfig, model) -> None:
        import uvicorn

        self.state = ServerState(config)
        self.state.load(model)
        app = Gate(create_app(self.state), self.state)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error",
                                                    timeout_keep_alive=5))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.state.close()


@contextlib.contextmanager
def live_server(model, **kwargs):
    s = LiveServer(ServerConfig(**kwargs), model)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def server(smol):
    """4 slots of 256 cells, /metrics on, SmolLM2; the defaults of a server started with no sampling flags."""
    with live_server(smol, n_slots=4, n_ctx=1024, metrics=True, alias=("smol",),
                     defaults=Defaults(params=SamplingParams())) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


class Reply:
    def __init__(self, status: int, headers: dict, body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        import json

        return json.loads(self.body)

    def events(self) -> list:
        """The SSE ``data:`` payloads (JSON, or the text ``[DONE]``)."""
        import json

        out = []
        for block in self.body.decode().split("\n\n"):
            for line in block.splitlines():
                if line.startswith("data: "):
                    data = line[6:]
                    out.append(data if data == "[DONE]" else json.loads(data))
        return out


def call(server, method: str, path: str, body=None, headers=None, raw: bytes | None = None) -> Reply:
    """One HTTP request (standard library only); the whole response is read."""
    import http.client
    import json

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    conn.request(method, path, body=data, headers=hdrs)
    r = conn.getresponse()
    reply = Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    conn.close()
    return reply
