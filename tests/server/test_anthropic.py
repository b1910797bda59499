"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) against a live server with SmolLM2
(ChatML without tool rendering: the generic JSON tool format), driven by the official ``anthropic`` client and by
raw HTTP where the wire itself is checked. Cases after llama.cpp's ``tools/server/tests/unit/test_compat_anthropic.py``
with exact values, plus Claude Code's request shape, bad blocks, waiting and leaving clients, and engine errors."""

import json
import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import anthropic
import jsonschema
import pytest
from tests.server.conftest import call, live_server

from samplechain.chat import ChatSyntax, MessageDiff
from samplechain.runtime.events import Final
from samplechain.server import anthropic_wire as wire
from samplechain.server import routes_anthropic

N_CTX_SLOT = 3072
GREEDY = {"temperature": 0, "seed": 7}
COLOURS = [{"role": "user", "content": "Name three colours."}]
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                                                             "unit": {"type": "string", "enum": ["C", "F"]}},
                            "required": ["city"]}}
SPECIAL = {"name": "special_function", "description": "I'm special",
           "input_schema": {"type": "object", "properties": {"arg1": {"type": "integer"}}, "required": ["arg1"]}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(smol):
    """2 slots of 3072 cells."""
    with live_server(smol, n_slots=2, n_ctx=2 * N_CTX_SLOT) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def oai(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


def events(reply) -> list[tuple[str, dict]]:
    """A stream's ``(event name, data)`` pairs."""
    assert reply.status == 200, reply.body
    assert reply.headers["content-type"].startswith("text/event-stream")
    out = []
    for block in reply.body.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = block.splitlines()
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        name, data = lines[0][7:], json.loads(lines[1][6:])
        assert data["type"] == name
        out.append((name, data))
    return out


def text_of(evs: list[tuple[str, dict]]) -> str:
    """The text of a stream's text deltas."""
    return "".join(d["delta"]["text"] for n, d in evs
                   if n == "content_block_delta" and d["delta"]["type"] == "text_delta")


def anthropic_error(reply, status: int = 400) -> str:
    """The message of an error answered in Anthropic's shape."""
    assert reply.status == status, reply.body
    body = reply.json()
    assert body["type"] == "error" and set(body) == {"type", "error"}
    assert body["error"]["type"] == "invalid_request_error" if status == 400 else body["error"]["type"]
    return body["error"]["message"]


# --- messages ------------------------------------------------------------------------------------------------------


def test_greedy_answer_is_the_chat_routes_answer(client, oai):
    system = [{"type": "text", "text": "You are a painter."}, {"type": "text", "text": "Answer briefly."}]
    content = [{"type": "text", "text": "Name three"}, {"type": "text", "text": "colours."}]
    r = client.messages.create(model="claude-local", max_tokens=12, system=system,
                               messages=[{"role": "user", "content": content}], extra_body=GREEDY)
    chat = oai.chat.completions.create(model="m", max_tokens=12, messages=[
        {"role": "system", "content": "You are a painter.\nAnswer briefly."},
        {"role": "user", "content": "Name three\ncolours."}], **GREEDY)
    assert r.content[0].text == chat.choices[0].message.content == "The three primary colours are:\n\nRed: The most"
    assert r.id.startswith("msg_") and len(r.id) == 28
    assert (r.type, r.role, r.model, len(r.content), r.content[0].type) == ("message", "assistant",
                                                                            "claude-local", 1, "text")
    assert (r.stop_reason, r.stop_sequence) == ("max_tokens", None)
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens


def test_max_tokens_and_stop_sequences(client):
    r = client.messages.create(model="m", max_tokens=5, messages=COLOURS, extra_body=GREEDY)
    assert (r.content[0].text, r.stop_reason, r.usage.output_tokens) == ("1. Red: This", "max_tokens", 5)
    r = client.messages.create(model="m", max_tokens=20, messages=COLOURS, stop_sequences=[":", "never"],
                               extra_body=GREEDY)
    assert (r.content[0].text, r.stop_reason, r.stop_sequence) == ("1. Red", "stop_sequence", ":")


def test_raw_body_without_v1_and_llama_cpp_fields(server):
    """``/messages`` answers too; llama.cpp's sampling fields pass through (here ``n_probs`` has no say and
    ``top_k: 1`` is greedy); no ``timings`` (llama.cpp's test); the model defaults to the loaded one."""
    body = {"max_tokens": 5, "messages": COLOURS, "top_k": 1, "min_p": 0.05, "samplers": ["top_k", "temperature"]}
    r = call(server, "POST", "/messages", body)
    out = r.json()
    assert r.status == 200 and out["content"] == [{"type": "text", "text": "1. Red: This"}]
    assert out["model"] == server.state.model_id and "timings" not in out
    assert set(out["usage"]) == {"input_tokens", "output_tokens", "cache_read_input_tokens"}


def test_prefill_and_history(client):
    """A last assistant message is continued; earlier turns, thinking blocks and redacted ones are accepted."""
    messages = [{"role": "user", "content": "Hello"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "Be nice.", "signature": "s"},
                                                  {"type": "redacted_thinking", "data": "xyz"},
                                                  {"type": "text", "text": "Hi there!"}]},
                {"role": "user", "content": "Name three colours."},
                {"role": "assistant", "content": "The first is"}]
    r = client.messages.create(model="m", max_tokens=3, messages=messages, extra_body=GREEDY)
    assert r.content[0].text == " blue, the"


# --- streaming -----------------------------------------------------------------------------------------------------


def test_stream_gives_the_same_text_in_order(server, client):
    kwargs = {"model": "m", "max_tokens": 12, "messages": COLOURS, "extra_body": GREEDY}
    whole = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == final.content[0].text == whole.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == (whole.stop_reason, whole.usage.output_tokens)

    evs = events(call(server, "POST", "/v1/messages", {"max_tokens": 12, "messages": COLOURS, "stream": True,
                                                        **GREEDY}))
    names = [n for n, _ in evs]
    k = names.index("content_block_stop")
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert set(names[3:k]) <= {"content_block_delta", "ping"} and names[k:] == ["content_block_stop",
                                                                                 "message_delta", "message_stop"]
    start = evs[0][1]["message"]
    assert (start["content"], start["stop_reason"], start["usage"]["output_tokens"]) == ([], None, 0)
    assert start["usage"]["input_tokens"] + start["usage"]["cache_read_input_tokens"] == 34
    assert evs[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert evs[k][1]["index"] == 0 and text_of(evs) == whole.content[0].text
    assert evs[-2][1]["delta"] == {"stop_reason": whole.stop_reason, "stop_sequence": None}
    assert evs[-2][1]["usage"]["output_tokens"] == whole.usage.output_tokens


def test_pings_while_waiting(server, monkeypatch):
    monkeypatch.setattr(routes_anthropic, "PING_SECONDS", 0.05)
    server.state.engine.step_hook = lambda: time.sleep(0.12)
    try:
        evs = events(call(server, "POST", "/v1/messages", {"max_tokens": 4, "messages": COLOURS, "stream": True,
                                                            **GREEDY}))
    finally:
        server.state.engine.step_hook = None
    names = [n for n, _ in evs]
    assert names.count("ping") >= 4 and names[-1] == "message_stop" and text_of(evs) == "1. Red:"


# --- tools ---------------------------------------------------------------------------------------------------------


def check_tool_use(block, tool) -> None:
    assert block.type == "tool_use" and block.name == tool["name"] and block.id.startswith("toolu_")
    jsonschema.validate(block.input, tool["input_schema"])


def test_tool_use_then_tool_result(client):
    r = client.messages.create(model="m", max_tokens=64, messages=ASK, tools=[WEATHER], tool_choice={"type": "any"},
                               extra_body=GREEDY)
    assert r.stop_reason == "tool_use" and len(r.content) == 1
    call_block = r.content[0]
    check_tool_use(call_block, WEATHER)
    assert call_block.input == {"city": "Paris"}
    history = [*ASK, {"role": "assistant", "content": [call_block.model_dump(exclude_none=True)]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_block.id,
                                             "content": [{"type": "text", "text": '{"temperature": 21}'}]}]}]
    answer = client.messages.create(model="m", max_tokens=8, messages=history, tools=[WEATHER],
                                    tool_choice={"type": "none"}, extra_body=GREEDY)
    assert answer.stop_reason == "max_tokens" and [b.type for b in answer.content] == ["text"]
    counted = client.messages.count_tokens(model="m", messages=history, tools=[WEATHER], tool_choice={"type": "none"})
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens == counted.input_tokens > 300
    failed = [*history[:2], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call_block.id, "is_error": True, "content": "City not found"},
        {"type": "text", "text": "Try again."}]}]
    assert client.messages.create(model="m", max_tokens=4, messages=failed, extra_body=GREEDY).content


def test_named_tool_and_no_parallel_calls(client):
    r = client.messages.create(model="m", max_tokens=64, messages=ASK, tools=[WEATHER, SPECIAL],
                               tool_choice={"type": "tool", "name": "special_function",
                                            "disable_parallel_tool_use": True}, extra_body=GREEDY)
    assert [b.type for b in r.content] == ["tool_use"] and r.stop_reason == "tool_use"
    check_tool_use(r.content[0], SPECIAL)


def test_streamed_tool_use_is_the_whole_answers(server, client):
    kwargs = {"model": "m", "max_tokens": 64, "messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "any"},
              "extra_body": GREEDY}
    whole = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[0].input == whole.content[0].input
    check_tool_use(final.content[0], WEATHER)
    evs = events(call(server, "POST", "/v1/messages?beta=true", {
        "max_tokens": 64, "messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "any"}, "stream": True,
        **GREEDY}))
    start = next(d for n, d in evs if n == "content_block_start")
    assert start["index"] == 0 and start["content_block"]["type"] == "tool_use"
    assert start["content_block"]["name"] == "get_weather" and start["content_block"]["input"] == {}
    partial = "".join(d["delta"]["partial_json"] for n, d in evs if n == "content_block_delta")
    assert json.loads(partial) == whole.content[0].input
    assert [n for n, _ in evs][-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_count_tokens_is_the_prompt_of_the_request(client):
    body = {"model": "m", "system": "You are terse.", "messages": ASK, "tools": [WEATHER, SPECIAL]}
    counted = client.messages.count_tokens(**body).input_tokens
    r = client.messages.create(max_tokens=2, extra_body={**GREEDY, "cache_prompt": False}, **body)
    assert r.usage.input_tokens == counted and r.usage.cache_read_input_tokens == 0
    assert client.messages.count_tokens(model="m", messages=COLOURS).input_tokens == 34


def test_no_messages_is_the_generation_prompt_alone(server):
    """``messages: []`` is answered, as llama-server does (its ``test_anthropic_empty_messages``): the template
    renders no turns, so the prompt is SmolLM2's assistant header, 4 tokens."""
    body = {"model": "m", "max_tokens": 5, "messages": [], **GREEDY}
    r = call(server, "POST", "/v1/messages", body)
    out = r.json()
    assert (r.status, out["type"], out["content"], out["stop_reason"]) == (
        200, "message", [{"type": "text", "text": "The original sentence is:"}], "max_tokens")
    assert out["usage"]["input_tokens"] + out["usage"]["cache_read_input_tokens"] == 4
    counted = call(server, "POST", "/v1/messages/count_tokens", {"model": "m", "messages": []})
    assert (counted.status, counted.json()) == (200, {"input_tokens": 4})
    assert wire.chat_messages({"messages": []}) == []
    prompt = call(server, "POST", "/apply-template", {"messages": []})
    assert (prompt.status, prompt.json()) == (200, {"prompt": "<|im_start|>assistant\n"})


def test_thinking_is_accepted(client):
    """SmolLM2 does not think: the request is answered, with the budget sampler waiting for a tag it never sees."""
    for thinking in ({"type": "enabled", "budget_tokens": 50}, {"type": "disabled"}, {"type": "adaptive"}):
        r = client.messages.create(model="m", max_tokens=5, messages=COLOURS, thinking=thinking, extra_body=GREEDY)
        assert [b.type for b in r.content] == ["text"] and r.content[0].text == "1. Red: This"


# --- Claude Code ---------------------------------------------------------------------------------------------------


def claude_code_tool(name: str, k: int) -> dict:
    """A tool shaped like Claude Code's: a description, a draft-07 schema with enums and, for the list tools, an
    array of objects (sized for a CPU test: Claude Code's own are several times longer)."""
    properties: dict = {"path": {"type": "string", "description": "The absolute path"},
                        "mode": {"type": "string", "enum": ["read", "write", f"mode{k}"]}}
    if name == "TodoWrite":
        properties["items"] = {"type": "array", "items": {"type": "object", "properties": {
            "content": {"type": "string", "minLength": 1},
            "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]}},
            "required": ["content", "status"], "additionalProperties": False}}
    return {"name": name, "description": f"Tool {name}. Use it with care.",
            "input_schema": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                             "additionalProperties": False, "properties": properties, "required": ["path"]},
            **({"cache_control": {"type": "ephemeral"}} if k == 11 else {})}


TOOL_NAMES = ["Task", "Bash", "Glob", "Grep", "LS", "ExitPlanMode", "Read", "Edit", "MultiEdit", "Write",
              "NotebookEdit", "TodoWrite"]


def claude_code_body(stream: bool) -> dict:
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; "
                                       "cch=a5145;"},
              {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
               "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "You are an interactive CLI tool that helps users with software engineering "
                                       "tasks. " * 10, "cache_control": {"type": "ephemeral"}}]
    user = [{"type": "text", "text": "<system-reminder>The date is today.</system-reminder>"},
            {"type": "text", "text": "Say hello.", "cache_control": {"type": "ephemeral"}}]
    return {"model": "claude-sonnet-4-5-20250929", "max_tokens": 32000, "system": system, "stream": stream,
            "messages": [{"role": "user", "content": user}],
            "tools": [*(claude_code_tool(n, k) for k, n in enumerate(TOOL_NAMES)),
                      {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}],
            "thinking": {"type": "enabled", "budget_tokens": 31999}, "metadata": {"user_id": "user_abc_session_1"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "temperature": 1, "seed": 3}


def test_claude_code_request(server):
    """Claude Code's request: cached system blocks, 12 tools with schemas and a server tool (left out), thinking
    with a budget of 31999 tokens and ``max_tokens: 32000`` (capped to the slot's 3072 cells), metadata, context
    management, beta headers and ``?beta=true``; answered, streaming and not."""
    headers = {"anthropic-version": "2023-06-01", "x-api-key": "sk-ant-x",
               "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-1m-2025-08-07"}
    counted = call(server, "POST", "/v1/messages/count_tokens?beta=true", claude_code_body(False), headers).json()
    room = N_CTX_SLOT - counted["input_tokens"]
    assert 0 < room < 32000
    r = call(server, "POST", "/v1/messages?beta=true", claude_code_body(False), headers)
    out = r.json()
    assert r.status == 200 and out["model"] == "claude-sonnet-4-5-20250929"
    assert out["usage"]["input_tokens"] + out["usage"]["cache_read_input_tokens"] == counted["input_tokens"]
    assert 0 < out["usage"]["output_tokens"] <= room
    assert out["stop_reason"] in ("end_turn", "tool_use", "max_tokens") and out["content"]
    evs = events(call(server, "POST", "/v1/messages?beta=true", claude_code_body(True), headers))
    assert [n for n, _ in evs][:2] == ["message_start", "ping"] and evs[-1][0] == "message_stop"
    assert 0 < evs[-2][1]["usage"]["output_tokens"] <= room


# --- bad input -----------------------------------------------------------------------------------------------------


def body_with(content=None, **fields) -> dict:
    return {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": content}], **fields}


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


@pytest.mark.parametrize(("body", "message"), [
    (body_with([IMAGE, {"type": "text", "text": "What is this?"}]),
     "messages.0.content.0: image input is not supported"),
    (body_with([{"type": "document", "source": {"type": "text", "data": "x", "media_type": "text/plain"}}]),
     "messages.0.content.0: document input is not supported"),
    (body_with([{"type": "tool_result", "tool_use_id": "t1", "content": [IMAGE]}]),
     "messages.0.content.0.content.0: image input is not supported"),
    (body_with([{"type": "audio", "data": "x"}]), "messages.0.content.0: unsupported content block type 'audio'"),
    (body_with([{"text": "no type"}]), "messages.0.content.0: a content block must be an object with a string 'type'"),
    (body_with(["just a string"]), "messages.0.content.0: a content block must be an object"),
    (body_with([{"type": "text", "text": 3}]), "messages.0.content.0: a text block needs a string 'text'"),
    (body_with([{"type": "tool_result", "content": "x"}]), "a tool_result block needs a string 'tool_use_id'"),
    (body_with([{"type": "tool_result", "tool_use_id": "t", "content": 5}]), "content must be a string or an array"),
    (body_with([{"type": "tool_use", "id": "t", "name": "f", "input": {}}]),
     "messages.0.content.0: a tool_use block cannot be in a user message"),
    ({"max_tokens": 8, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                                        "input": "[1]"}]}]},
     "messages.0.content.0: a tool_use block's 'input' must be an object"),
    ({"max_tokens": 8, "messages": [{"role": "assistant", "content": [{"type": "thinking"}]}]},
     "a thinking block needs a string 'thinking'"),
    (body_with(42), "messages.0: 'content' must be a string or an array of content blocks"),
    ({"max_tokens": 8, "messages": [{"role": "user"}]}, "messages.0: 'content' is required"),
    ({"max_tokens": 8, "messages": [{"role": "tool", "content": "x"}]},
     "messages.0: unexpected role 'tool': a message's role is 'user', 'assistant' or 'system'"),
    ({"max_tokens": 8, "messages": "hi"}, "'messages' must be an array"),
    ({"max_tokens": 8}, "'messages' is required"),
    ({"messages": COLOURS}, "max_tokens: Field required"),
    ({"messages": COLOURS, "max_tokens": 0}, "max_tokens: must be an integer of at least 1"),
    (body_with("x", system=[{"type": "image"}]), "system.0: image input is not supported"),
    (body_with("x", system=5), "system: must be a string or an array of text blocks"),
    (body_with("x", tools=[{"name": "f", "input_schema": "object"}]), "tools.0: 'input_schema' must be a JSON schema"),
    (body_with("x", tools=[{"input_schema": {}}]), "function.name must be a non-empty string"),
    (body_with("x", tools=[WEATHER], tool_choice={"type": "function"}), "tool_choice: must be"),
    (body_with("x", tools=[WEATHER], tool_choice={"type": "tool"}), "needs the tool's 'name'"),
    (body_with("x", tools=[WEATHER], tool_choice={"type": "tool", "name": "nope"}), "'nope' is not one of the tools"),
    (body_with("x", thinking={"type": "enabled", "budget_tokens": "many"}), "thinking.budget_tokens"),
    (body_with("x", thinking={"type": "sometimes"}), "thinking: must be"),
    (body_with("x", stop_sequences="END"), "stop_sequences: must be an array of strings"),
    (body_with("x", temperature="hot"), "Field 'temperature'"),
])
def test_malformed_requests_are_400_in_anthropic_shape(server, body, message):
    t0 = time.process_time()
    got = anthropic_error(call(server, "POST", "/v1/messages", body))
    assert message in got and time.process_time() - t0 < 2.0
    if "max_tokens" not in message and "Field" not in message:  # count_tokens: the same blocks, no sampling
        assert message in anthropic_error(call(server, "POST", "/v1/messages/count_tokens", body))


def test_a_prompt_longer_than_the_context_is_400(server):
    long = [{"role": "user", "content": "Tell me about colours. " * 900}]
    message = anthropic_error(call(server, "POST", "/v1/messages", {"max_tokens": 8, "messages": long}))
    assert message.startswith("request (") and f"exceeds the available context size ({N_CTX_SLOT} tokens)" in message


def both_routes(server, body) -> list[tuple[int, str]]:
    """Status and message of ``/v1/messages`` and ``/v1/messages/count_tokens`` for ``body``, each answered within
    2 seconds of this process's CPU (the server runs in it; a loaded machine stretches wall time) and in
    Anthropic's error shape."""
    out = []
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        t0 = time.process_time()
        r = call(server, "POST", path, body)
        assert time.process_time() - t0 < 2.0, path
        out.append((r.status, anthropic_error(r)))
    return out


def test_tool_choice_any_or_tool_without_tools_is_400(server):
    """``any`` and ``tool`` need a tool to call (Anthropic answers 400); server tools are left out, so a request
    with only those has none."""
    for choice, extra in (({"type": "any"}, {}), ({"type": "tool", "name": "get_weather"}, {}),
                          ({"type": "any"}, {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                          ({"type": "tool", "name": "get_weather"}, {"tools": []})):
        message = (f'tool_choice: {{"type": "{choice["type"]}"}} needs at least one tool in \'tools\' (this server '
                   "calls custom tools only)")
        assert both_routes(server, body_with("x", tool_choice=choice, **extra)) == [(400, message)] * 2


def test_content_blocks_and_translated_messages_are_bounded(server):
    """``MAX_MESSAGES`` bounds the content blocks in all (counted before any is read: 100,000 tool_result blocks
    in one message are refused at once) and the messages they become (each tool_result is a message)."""
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}
    blocks = "Field 'messages': at most 4096 content blocks in all (the system's, the messages' and their " \
             "tool_results'), got {}"
    assert both_routes(server, body_with([result] * 100_000)) == [(400, blocks.format(100_000))] * 2
    nested = {**result, "content": [{"type": "text", "text": "a"}] * 2100}
    assert both_routes(server, body_with([nested, nested])) == [(400, blocks.format(4202))] * 2
    assert both_routes(server, body_with("x", system=[{"type": "text", "text": "s"}] * 4097)) == [
        (400, blocks.format(4097))] * 2
    messages = ("Field 'messages': at most 4096 messages, got 4097 (each tool_result block is a message of its own, "
                "and so is the system prompt)")
    assert both_routes(server, body_with([result] * 4096, system="Be brief.")) == [(400, messages)] * 2
    counted = call(server, "POST", "/v1/messages/count_tokens", body_with([result] * 2))
    assert counted.status == 200 and counted.json()["input_tokens"] > 0


def test_count_tokens_refuses_text_that_cannot_fit(server):
    """``count_tokens`` refuses, before rendering or tokenizing, text that cannot fit in a slot's context, as
    ``/v1/messages`` does (4M characters were tokenized, holding the GIL for seconds); text that fits is counted."""
    huge = body_with("x" * 4_000_000)
    message = f"request (4000000 characters) exceeds the available context size ({N_CTX_SLOT} tokens), try " \
              "increasing it (serve -c / --ctx-size; each of the -np slots holds -c / -np)"
    assert both_routes(server, huge) == [(400, message)] * 2
    fits = call(server, "POST", "/v1/messages/count_tokens", body_with("Tell me about colours. " * 900))
    assert fits.status == 200 and fits.json()["input_tokens"] > N_CTX_SLOT  # counted, even past the context


def test_left_out_tool_types_are_one_bounded_log_line(caplog):
    """The server tools a request names are logged once per request, each type once and cut to 64 characters, 8
    of them then how many more: no state is kept between requests (50,000 types grew a module set forever)."""
    tools = [WEATHER, *({"type": f"t{k}_" + "x" * 100, "name": f"s{k}"} for k in range(50_000)),
             {"type": "t0_" + "x" * 100}]
    body = {"max_tokens": 4, "messages": COLOURS, "tools": tools}
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=wire.__name__):
            t = wire.translate(body, "auto")
        assert [x["function"]["name"] for x in t.request.tools] == ["get_weather"]
        shown = ", ".join(repr(f"t{k}_" + "x" * (64 - len(f"t{k}_"))) for k in range(8))
        assert [r.getMessage() for r in caplog.records] == [
            f"anthropic: 50001 tools of Anthropic's own types left out (this server runs custom tools only): "
            f"{shown} and 49992 more"]
    assert not any(isinstance(v, set) for v in vars(wire).values())


def test_bad_json_and_unknown_key_are_anthropic_errors(server):
    assert "parse_error" in anthropic_error(call(server, "POST", "/v1/messages", raw=b"{nope"))
    with live_server(server.state.model, n_slots=1, n_ctx=512, api_keys=("k1",)) as keyed:
        assert anthropic_error(call(keyed, "POST", "/v1/messages", body_with("x")), 401) == "Invalid API Key"
        r = call(keyed, "POST", "/v1/messages", body_with("Hi", **GREEDY), {"x-api-key": "k1"})
        assert r.status == 200 and r.json()["type"] == "message"


# --- waiting, leaving and failing ----------------------------------------------------------------------------------


def test_more_requests_than_slots_all_complete(server, client):
    def one(k: int) -> str:
        kwargs = {"model": "m", "max_tokens": 6, "messages": COLOURS, "extra_body": GREEDY}
        if k % 2:
            with client.messages.stream(**kwargs) as stream:
                return stream.get_final_message().content[0].text
        return client.messages.create(**kwargs).content[0].text

    with ThreadPoolExecutor(6) as pool:
        texts = list(pool.map(one, range(6)))
    assert texts == ["1. Red: This is"] * 6


def test_a_client_that_leaves_mid_stream_stops_its_task(server, client):
    engine = server.state.engine
    engine.step_hook = lambda: time.sleep(0.05)
    try:
        body = json.dumps({"max_tokens": 400, "messages": COLOURS, "stream": True, "ignore_eos": True, **GREEDY})
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        sock.sendall(f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        seen = b""
        while b"content_block_delta" not in seen:
            chunk = sock.recv(4096)
            assert chunk, seen
            seen += chunk
        sock.close()
        other = client.messages.create(model="m", max_tokens=6, messages=COLOURS, extra_body=GREEDY)
        assert other.content[0].text == "1. Red: This is"
        deadline = time.time() + 10
        while any(s.busy for s in engine.slots):
            assert time.time() < deadline, "the stream's task was not cancelled"
            time.sleep(0.05)
    finally:
        engine.step_hook = None


def test_an_engine_error_mid_stream_is_an_error_event(server):
    steps = []

    def fail_at_fourth() -> None:
        steps.append(1)
        if len(steps) == 4:
            raise RuntimeError("the device went away")

    server.state.engine.step_hook = fail_at_fourth
    try:
        evs = events(call(server, "POST", "/v1/messages", {"max_tokens": 20, "messages": COLOURS, "stream": True,
                                                            **GREEDY}))
    finally:
        server.state.engine.step_hook = None
    assert evs[0][0] == "message_start" and "content_block_delta" in [n for n, _ in evs]
    assert evs[-1] == ("error", {"type": "error", "error": {"type": "api_error",
                                                            "message": "RuntimeError: the device went away"}})


# --- the wire, without a model -------------------------------------------------------------------------------------


def final(text: str, stop_type: str = "eos", word: str = "") -> Final:
    return Final(text, [], stop_type, word, False, False, 10, 4, 3, {}, [], 0)


def test_thinking_comes_first_with_a_signature():
    syntax = ChatSyntax(tags=("<think>", "</think>"))
    out = wire.message(final("<think>Two and two.</think>Four."), syntax, "msg_1", "m", ())
    assert out["content"] == [{"type": "thinking", "thinking": "Two and two.", "signature": ""},
                              {"type": "text", "text": "Four."}]
    assert out["usage"] == {"cache_read_input_tokens": 3, "input_tokens": 7, "output_tokens": 4}
    writer = wire.EventWriter("msg_1", "m", syntax, ())
    raw = writer.start(10, 3) + writer.token("<think>Two") + writer.token(" and two.</think>") + writer.token("Four.")
    raw += writer.finish(final("<think>Two and two.</think>Four."))
    evs = [(b.split("\n")[0][7:], json.loads(b.split("\n")[1][6:])) for b in raw.decode().split("\n\n") if b]
    assert [(n, d.get("index"), d.get("delta", d.get("content_block", {})).get("type")) for n, d in evs] == [
        ("message_start", None, None), ("ping", None, None), ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "thinking_delta"), ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"), ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"), ("content_block_delta", 1, "text_delta"), ("content_block_stop", 1, None),
        ("message_delta", None, None), ("message_stop", None, None)]
    assert "".join(d["delta"].get("thinking", "") for _, d in evs if "delta" in d) == "Two and two."


def test_stop_reasons_and_tool_inputs():
    assert wire.stop_reason(final("x", "limit"), True, ()) == ("max_tokens", None)
    assert wire.stop_reason(final("x", "word", "END"), False, ("END",)) == ("stop_sequence", "END")
    assert wire.stop_reason(final("x", "word", "</tool>"), False, ("END",)) == ("end_turn", None)
    assert wire.stop_reason(final("x", "word", "END"), True, ("END",)) == ("tool_use", None)
    # input is always an object: arguments that are not JSON, or hold another value, are {} (never a list or text)
    args = ('{"a": 1}', "[1, 2]", '"text"', "3", "null", '{"a": ', "")
    assert [wire.tool_input(a) for a in args] == [{"a": 1}, {}, {}, {}, {}, {}, {}]
    syntax = ChatSyntax()
    out = wire.message(final("x"), syntax, "msg_1", "m", ())
    assert out["content"] == [{"type": "text", "text": "x"}]


def test_streamed_tool_input_is_an_object():
    """A call whose arguments start an object streams them as ``input_json_delta``s (leading whitespace left
    out); one whose arguments are another JSON value streams none: its block's ``input`` stays ``{}``, as the whole
    message's ``tool_input`` has it."""
    writer = wire.EventWriter("msg_1", "m", ChatSyntax(), ())
    def args(index: int, *texts: str) -> list[MessageDiff]:
        return [MessageDiff(tool_index=index, tool_id=str(index) * 30, tool_name="fgh"[index], header=True),
                *(MessageDiff(tool_index=index, tool_arguments=t) for t in texts)]

    raw = writer.diffs([*args(0, " ", ' {"a"', ": 1}"), *args(1, "[1, ", "2]"), *args(2, '"text"')])
    evs = [json.loads(b.split("\n")[1][6:]) for b in raw.decode().split("\n\n") if b]
    starts = [e["content_block"] for e in evs if e["type"] == "content_block_start"]
    assert [(b["name"], b["input"]) for b in starts] == [("f", {}), ("g", {}), ("h", {})]
    deltas = [(e["index"], e["delta"]) for e in evs if e["type"] == "content_block_delta"]
    assert deltas == [(0, {"type": "input_json_delta", "partial_json": '{"a"'}),
                      (0, {"type": "input_json_delta", "partial_json": ": 1}"})]


def test_translation_of_blocks_to_messages():
    body = {"max_tokens": 5, "system": "Be brief.", "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Call it.", "signature": "x"},
                                          {"type": "text", "text": "Let me check."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}, "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"},
                                     {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True},
                                     {"type": "text", "text": "Thanks."}]},
        {"role": "user", "content": []}],
        "tools": [WEATHER, {"type": "bash_20250124", "name": "bash"}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}, "stop_sequences": ["END"],
        "thinking": {"type": "enabled", "budget_tokens": 31999}, "metadata": {"user_id": "u"}, "min_p": 0.1}
    t = wire.translate(body, "auto")
    assert t.messages == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "Call it.",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                         "id": "toolu_1"}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: "},
        {"role": "user", "content": "Thanks."}]
    assert [x["function"]["name"] for x in t.request.tools] == ["get_weather"]
    assert (t.request.choice, t.request.parallel, t.stops, t.max_tokens) == ("auto", False, ("END",), 5)
    assert (t.options.enable_thinking, t.fields["thinking_budget_tokens"], t.fields["n_predict"]) == (True, 31999, 5)
    assert t.fields["stop"] == ["END"] and t.fields["min_p"] == 0.1 and "metadata" not in t.fields
    assert wire.system_text([{"type": "text", "text": "x-anthropic-billing-header: a=1; cch=a5145; b=2"},
                             {"type": "text", "text": "Hi"}]) == "x-anthropic-billing-header: a=1; cch=fffff; b=2\nHi"



def test_mid_conversation_system_messages_join_the_system_prompt(server):
    # Claude Code 2.1.197 sends system messages inside `messages` (its "mid-conversation-system" beta): they join
    # the system prompt in order, since most templates take a system message only first
    inside = {"model": "m", "max_tokens": 4, "system": "You are brief.", **GREEDY,
              "messages": [{"role": "user", "content": "Name three colours."},
                           {"role": "system", "content": "Agents: none."}]}
    joined = {**inside, "system": "You are brief.\nAgents: none.",
              "messages": [{"role": "user", "content": "Name three colours."}]}
    counts = [call(server, "POST", "/v1/messages/count_tokens", b).json()["input_tokens"] for b in (inside, joined)]
    assert counts[0] == counts[1]
    answers = [call(server, "POST", "/v1/messages", b).json() for b in (inside, joined)]
    assert answers[0]["content"] == answers[1]["content"] and answers[0]["stop_reason"] == "max_tokens"
