"""Live servers on loopback (uvicorn in a thread, any free port) over the session's SmolLM2."""

import contextlib

import pytest

from samplechain.params import SamplingParams
from samplechain.server.app import BackgroundServer, ServerConfig
from samplechain.server.config import Defaults


@contextlib.contextmanager
def live_server(model, **kwargs):
    with BackgroundServer(ServerConfig(**{"port": 0, **kwargs}), model) as s:
        yield s


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
