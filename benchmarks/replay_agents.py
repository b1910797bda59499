"""Claude Code's and Codex's requests replayed against a real ``samplechain serve`` process (loopback only).

The bodies are ``benchmarks/agent_requests.py``'s (the clients' captured shapes at their sizes: Claude Code's 86 KB
``/v1/messages?beta=true`` with its headers, 12 tools, thinking with a 31,999-token budget and ``max_tokens:
32000``; Codex's 37 KB ``/v1/responses`` with 7 function tools, a ``namespace`` and a ``web_search`` tool). Each is
sent streamed (as the clients send it first) and not (Claude Code's retry), and each answer's shape is checked as
the client reads it: Anthropic's events in order (``message_start`` ... ``message_stop``, every block started,
delta'd and stopped, a ``message_delta`` with a stop reason) or the Responses events (``sequence_number`` 0..n-1,
``response.created`` first, ``response.completed`` / ``incomplete`` last with the whole response, every item added
before its deltas and done after them). The server logs its grammar compile and the table shows the prompt size.

``--max-tokens N`` (default 128) replaces the bodies' own limits so a run ends in minutes on a small CPU; ``0``
replays them as sent (the server caps 32000 to the context).

    python -m benchmarks.replay_agents [-m gemma3-270m] [-c 32768] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import time
from typing import Any

from benchmarks.agent_requests import claude_code_body, claude_code_headers, codex_body
from benchmarks.probe_server import free_port


def post(port: int, path: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes, float]:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **headers})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data, time.perf_counter() - t0


def sse(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each server-sent event."""
    out = []
    for block in data.decode().split("\n\n"):
        name, payload = "", None
        for line in block.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                payload = json.loads(line[5:].strip())
        if payload is not None:
            out.append((name, payload))
    return out


def check_anthropic_stream(events: list[tuple[str, dict[str, Any]]]) -> str:
    """'' when the events are in Anthropic's order, else what is wrong."""
    names = [n for n, _ in events if n != "ping"]
    if not names or names[0] != "message_start" or names[-1] != "message_stop":
        return f"starts {names[:1]} ends {names[-1:]}"
    open_block = None
    for name, ev in events:
        if ev.get("type") != name:
            return f"event {name} carries type {ev.get('type')}"
        if name == "content_block_start":
            if open_block is not None:
                return "a block starts before the last stopped"
            open_block = ev["index"]
        elif name in ("content_block_delta", "content_block_stop") and ev["index"] != open_block:
            return f"{name} for block {ev['index']} while {open_block} is open"
        if name == "content_block_stop":
            open_block = None
    deltas = [ev for n, ev in events if n == "message_delta"]
    if len(deltas) != 1 or deltas[0]["delta"].get("stop_reason") not in ("end_turn", "max_tokens", "stop_sequence",
                                                                         "tool_use"):
        return "no message_delta with a stop reason"
    return ""


def check_anthropic(body: dict[str, Any]) -> str:
    if body.get("type") != "message" or body.get("role") != "assistant":
        return "not a message"
    if any(b.get("type") not in ("text", "thinking", "tool_use") for b in body["content"]):
        return "unknown block"
    return "" if body.get("stop_reason") in ("end_turn", "max_tokens", "stop_sequence", "tool_use") else "stop?"


def check_responses_stream(events: list[tuple[str, dict[str, Any]]]) -> str:
    if [ev.get("sequence_number") for _, ev in events] != list(range(len(events))):
        return "sequence numbers are not 0..n-1"
    if any(name != ev.get("type") for name, ev in events):
        return "an event line differs from its type"
    if events[0][0] != "response.created" or events[-1][0] not in ("response.completed", "response.incomplete"):
        return f"starts {events[0][0]} ends {events[-1][0]}"
    added, done = set(), set()
    for name, ev in events:
        if name == "response.output_item.added":
            added.add(ev["item"]["id"])
        elif name == "response.output_item.done":
            done.add(ev["item"]["id"])
        elif "item_id" in ev and (ev["item_id"] not in added or ev["item_id"] in done):
            return f"{name} outside its item"
    final = events[-1][1]["response"]
    return "" if added == done == {item["id"] for item in final["output"]} else "items differ from the response's"


def check_responses(body: dict[str, Any]) -> str:
    if body.get("object") != "response" or body.get("status") not in ("completed", "incomplete"):
        return "not a finished response"
    kinds = {item["type"] for item in body["output"]}
    return "" if kinds <= {"message", "function_call", "reasoning"} else f"items {kinds}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="gemma3-270m")
    ap.add_argument("-c", "--ctx-size", type=int, default=32768)
    ap.add_argument("--max-tokens", type=int, default=128, help="replace the bodies' limits (0: as sent)")
    args = ap.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "samplechain", "serve", "-m", args.model, "-c",
                               str(args.ctx_size), "--port", str(port), "-np", "1"], env=dict(os.environ))
    try:
        for _ in range(600):
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        print("| client | stream | status | prompt tokens | output tokens | s | shape |\n|---|---|---|---|---|---|---|")
        for stream in (True, False):
            body = claude_code_body(stream=stream)
            if args.max_tokens:
                body["max_tokens"] = args.max_tokens
            status, data, dt = post(port, "/v1/messages?beta=true", body, claude_code_headers())
            if status != 200:
                print(f"| Claude Code | {stream} | {status} | | | {dt:.1f} | {data[:200]!r} |")
                continue
            if stream:
                events = sse(data)
                usage_in = next(ev for n, ev in events if n == "message_start")["message"]["usage"]
                usage_out = next(ev for n, ev in events if n == "message_delta")["usage"]
                shape = check_anthropic_stream(events)
            else:
                reply = json.loads(data)
                usage_in = usage_out = reply["usage"]
                shape = check_anthropic(reply)
            n_in = usage_in["input_tokens"] + usage_in.get("cache_read_input_tokens", 0)
            print(f"| Claude Code | {stream} | {status} | {n_in} | {usage_out['output_tokens']} | {dt:.1f} | "
                  f"{shape or 'ok'} |", flush=True)
        for stream in (True, False):
            body = codex_body(stream=stream)
            if args.max_tokens:
                body["max_output_tokens"] = args.max_tokens
            status, data, dt = post(port, "/v1/responses", body, {})
            if status != 200:
                print(f"| Codex | {stream} | {status} | | | {dt:.1f} | {data[:200]!r} |")
                continue
            if stream:
                events = sse(data)
                reply, shape = events[-1][1]["response"], check_responses_stream(events)
            else:
                reply = json.loads(data)
                shape = check_responses(reply)
            print(f"| Codex | {stream} | {status} | {reply['usage']['input_tokens']} | "
                  f"{reply['usage']['output_tokens']} | {dt:.1f} | {shape or 'ok'} |", flush=True)
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
