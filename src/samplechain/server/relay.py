"""Relaying another server's answer (the router's children, Ray Serve's replicas): an error in the API's own shape
when the server behind dies, as a JSON body before anything was sent, or as a cut stream's final event."""

from __future__ import annotations

import re

from samplechain.server.anthropic_wire import error_event as anthropic_error_event
from samplechain.server.limits import APIError
from samplechain.server.responses import error_body, json_bytes, sse

RESPONSES_PATHS = ("/v1/responses", "/responses")
RESPONSE_ID = re.compile(rb'"id"\s*:\s*"(resp_[A-Za-z0-9]+)"')
# headers of one hop (RFC 9110 7.6.1), never relayed; content-length is the relay's own
HOP_HEADERS = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                         "transfer-encoding", "upgrade", "content-length", "host"})


class StreamTail:
    """What a relay needs to end a cut stream in its API's shape: for the Responses API, the last
    ``sequence_number`` and the response's id (its final ``error`` + ``response.failed`` events continue them)."""

    SEQ = re.compile(rb'"sequence_number"\s*:\s*(\d+)')

    def __init__(self, path: str) -> None:
        self.path, self.seq, self.rid = path, -1, None

    def see(self, chunk: bytes) -> None:
        if not self.path.startswith(RESPONSES_PATHS):
            return
        numbers = self.SEQ.findall(chunk)
        if numbers:
            self.seq = int(numbers[-1])
        if self.rid is None:
            found = RESPONSE_ID.search(chunk)
            if found is not None:
                self.rid = found.group(1).decode()

    def final_event(self, e: APIError) -> bytes:
        """The stream's last event: Anthropic's ``event: error``; the Responses API's ``error`` then
        ``response.failed``; ``data: {"error": ...}`` elsewhere (llama-server's and OpenAI's streams)."""
        if self.path.startswith(("/v1/messages", "/messages")):
            return anthropic_error_event(e)
        if self.path.startswith(RESPONSES_PATHS):
            out = b""
            for kind, data in (("error", {"code": e.kind, "message": e.message, "param": None}),
                               ("response.failed", {"response": {"id": self.rid, "object": "response",
                                                                 "status": "failed",
                                                                 "error": {"code": "server_error",
                                                                           "message": e.message}}})):
                self.seq += 1
                out += (b"event: " + kind.encode() + b"\ndata: "
                        + json_bytes({"type": kind, "sequence_number": self.seq, **data}) + b"\n\n")
            return out
        return sse(e.body())


def error_response(path: str, e: APIError, extra: list[tuple[bytes, bytes]] = ()) -> tuple[
        int, list[tuple[bytes, bytes]], bytes]:
    """An error answer before anything was sent: (status, headers, JSON body in the API's shape)."""
    body = json_bytes(error_body(path, e))
    headers = [(b"content-type", b"application/json; charset=utf-8"), (b"content-length", str(len(body)).encode()),
               *extra]
    return e.code, headers, body
