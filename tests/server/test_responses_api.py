"""OpenAI's Responses API (``/v1/responses``) against a live server over SmolLM2: the official ``openai`` client,
the ``openai-agents`` SDK, a Codex-like request, malformed input, and more requests than slots. Compare llama.cpp's
tools/server/tests/unit/test_compat_oai_responses.py."""

import asyncio
import http.client
import json
import logging
import threading
import time

import jsonschema
import openai
import pytest
from tests.server.conftest import call, live_server

from samplechain.chat import ChatSyntax
from samplechain.runtime.events import Error, Final, Token
from samplechain.server import responses_wire as rw
from samplechain.server.request import Options
from samplechain.server.routes_responses import ResponseStream

QUESTION = "Name three colours."
WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
           "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
                          "required": ["location"]}, "strict": False}
ASK = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def server(smol):
    """2 slots of 2048 cells."""
    with live_server(smol, n_slots=2, n_ctx=4096) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def sse(body: bytes) -> list[tuple[str, dict]]:
    """The ``event:`` names and ``data:`` payloads of a Responses stream."""
    out = []
    for block in body.decode().split("\n\n"):
        lines = block.splitlines()
        if lines:
            assert lines[0].startswith("event: ") and lines[1].startswith("data: ") and len(lines) == 2
            out.append((lines[0][7:], json.loads(lines[1][6:])))
    return out


def check_stream(events: list[tuple[str, dict]]) -> dict:
    """A well-formed stream: numbered 0..n-1, each event named as its type, created and in_progress first, every
    item added before its deltas and done after them, at its output index, and the last event's response holding
    the items as they were done. Returns that response."""
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert all(name == data["type"] for name, data in events)
    assert [name for name, _ in events[:2]] == ["response.created", "response.in_progress"]
    rid = events[0][1]["response"]["id"]
    assert rid.startswith("resp_") and events[1][1]["response"]["id"] == rid
    added, done = {}, {}
    for name, data in events[2:-1]:
        if name == "response.output_item.added":
            assert data["output_index"] == len(added) and data["item"]["status"] == "in_progress"
            added[data["output_index"]] = data["item"]["id"]
        elif name == "response.output_item.done":
            assert added[data["output_index"]] == data["item"]["id"] and data["output_index"] not in done
            done[data["output_index"]] = data["item"]
        elif "item_id" in data:
            assert added[data["output_index"]] == data["item_id"] and data["output_index"] not in done
    last_name, last = events[-1]
    assert last_name in ("response.completed", "response.incomplete") and last["response"]["id"] == rid
    assert last["response"]["output"] == [done[i] for i in range(len(done))]
    return last["response"]


# --- text ---------------------------------------------------------------------------------------------------------


def test_text_equals_chat_completions(client):
    instructions = "You are a helpful assistant."
    r = client.responses.create(model="gpt-4.1", instructions=instructions, max_output_tokens=16, temperature=0,
                                input=[{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}],
                                extra_body={"seed": 1})
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "gpt-4.1"
    assert r.output_text == "There are no three colours in the world."
    [item] = r.output
    assert item.type == "message" and item.id.startswith("msg_") and item.role == "assistant"
    assert (r.status, r.incomplete_details, item.status) == ("completed", None, "completed")
    assert (r.usage.output_tokens, r.usage.output_tokens_details.reasoning_tokens) == (10, 0)
    assert r.usage.total_tokens == r.usage.input_tokens + 10
    assert (r.instructions, r.max_output_tokens, r.temperature, r.tool_choice, r.tools) == (
        instructions, 16, 0.0, "auto", [])
    chat = client.chat.completions.create(model="m", max_tokens=16, temperature=0, seed=1, messages=[
        {"role": "system", "content": instructions}, {"role": "user", "content": QUESTION}])
    assert chat.choices[0].message.content == r.output_text
    assert chat.usage.prompt_tokens == r.usage.input_tokens


def test_string_input_developer_role_and_extras(client):
    a = client.responses.create(model="m", input=QUESTION, max_output_tokens=8, temperature=0)
    b = client.responses.create(model="m", input=[{"type": "message", "role": "user", "content": QUESTION}],
                                max_output_tokens=8, temperature=0)
    assert a.output_text == b.output_text == "1. Red: This is the most"
    assert (a.status, a.incomplete_details.reason, a.output[0].status) == ("incomplete", "max_output_tokens",
                                                                           "incomplete")
    # llama.cpp's sampling fields pass through: a stop string ends the answer (completed, not incomplete)
    c = client.responses.create(model="m", input=QUESTION, max_output_tokens=8, temperature=0,
                                extra_body={"stop": [":"], "top_k": 1})
    assert (c.output_text, c.status, c.incomplete_details) == ("1. Red", "completed", None)
    dev = client.responses.create(model="m", max_output_tokens=8, temperature=0, input=[
        {"role": "developer", "content": "Answer in French."}, {"role": "user", "content": QUESTION}])
    sys_ = client.chat.completions.create(model="m", max_tokens=8, temperature=0, messages=[
        {"role": "system", "content": "Answer in French."}, {"role": "user", "content": QUESTION}])
    assert dev.output_text == sys_.choices[0].message.content


def test_max_output_tokens_one_and_beyond_the_context(client):
    r = client.responses.create(model="m", input="Hi", max_output_tokens=1, temperature=0)
    assert r.status == "incomplete" and r.usage.output_tokens == 1 and len(r.output) == 1
    r = client.responses.create(model="m", input=QUESTION, max_output_tokens=10**9, temperature=0,
                                extra_body={"stop": [":"]})
    assert (r.status, r.output_text, r.max_output_tokens) == ("completed", "1. Red", 10**9)


def test_stream_adds_up_to_the_answer(client):
    kwargs = {"model": "gpt-4.1", "input": [{"role": "system", "content": "Book"},
                                            {"role": "user", "content": "What is the best book"}],
              "max_output_tokens": 12, "temperature": 0}
    whole = client.responses.create(**kwargs)
    text, msg_id, seqs, last = "", None, [], None
    for ev in client.responses.create(stream=True, **kwargs):
        seqs.append(ev.sequence_number)
        if ev.type == "response.output_item.added":
            msg_id = ev.item.id
            assert msg_id.startswith("msg_")
        if ev.type in ("response.content_part.added", "response.output_text.delta", "response.output_text.done",
                       "response.content_part.done"):
            assert ev.item_id == msg_id and ev.output_index == 0 and ev.content_index == 0
        if ev.type == "response.output_text.delta":
            text += ev.delta
        if ev.type == "response.output_text.done":
            assert ev.text == text
        last = ev
    assert seqs == list(range(len(seqs)))
    assert last.type == "response.incomplete" and last.response.output[0].id == msg_id
    assert text == last.response.output_text == whole.output_text and text
    assert last.response.usage.output_tokens == 12


def test_stream_telemetry(server):
    # llama.cpp's test_responses_stream_with_llama_telemetry: prompt progress and per-token timings
    r = call(server, "POST", "/responses", {"input": "This is a test" * 10, "max_output_tokens": 8,
                                            "temperature": 0.8, "stream": True, "timings_per_token": True,
                                            "return_progress": True})
    assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse(r.body)
    check_stream(events)
    progress = [d for _, d in events if "prompt_progress" in d]
    assert progress and all(d["type"] == "response.in_progress" and d["prompt_progress"]["total"] > 0
                            for d in progress)
    assert any(d["type"] == "response.output_text.delta" and "predicted_per_second" in d["timings"]
               for _, d in events if "timings" in d)
    assert "usage" in events[-1][1]["response"] and "prompt_per_second" in events[-1][1]["timings"]


def test_stream_writes_reasoning_items():
    # the writer itself, fed an answer with a thinking block (SmolLM2 does not think)
    settings = rw.Settings("m", [], {}, 0.0, 1.0)
    stream = ResponseStream(settings, "resp_x", 0, ChatSyntax(), Options(stream=True))
    body = stream.start()
    for piece in ["<think>", "Let me", " see.", "</think>", "Blue", " and red."]:
        body += stream.token(Token(0, piece, None, 1, 3, 0, {}))
    final = Final("<think>Let me see.</think>Blue and red.", [], "eos", "", False, False, 3, 6, 0, {}, [], 0)
    chunk, response = stream.finish(final, lambda text: 2 if text else 0)
    events = sse(body + chunk)
    assert check_stream(events) == response
    assert [name for name, _ in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta", "response.reasoning_text.done",
        "response.content_part.done", "response.output_item.done", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    reasoning, message = response["output"]
    assert reasoning["id"].startswith("rs_") and reasoning["content"] == [{"type": "reasoning_text",
                                                                           "text": "Let me see."}]
    assert message["content"][0]["text"] == "Blue and red." and message["status"] == "completed"
    assert response["usage"]["output_tokens_details"] == {"reasoning_tokens": 2}
    parsed = openai.types.responses.Response.model_validate(response)
    assert parsed.output_text == "Blue and red."


def test_stream_error_mid_answer_fails_the_response():
    stream = ResponseStream(rw.Settings("m", [], {}, 0.0, 1.0), "resp_x", 0, ChatSyntax(), Options(stream=True))
    body = stream.start() + stream.token(Token(0, "Blue", None, 1, 3, 0, {}))
    events = sse(body + stream.fail(Error(500, "the engine stopped", "server_error")))
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert [name for name, _ in events[-5:]] == ["response.output_text.done", "response.content_part.done",
                                                 "response.output_item.done", "error", "response.failed"]
    assert events[-2][1]["message"] == "the engine stopped"
    failed = events[-1][1]["response"]
    assert failed["status"] == "failed" and failed["error"]["message"] == "the engine stopped"
    assert failed["output"][0]["content"][0]["text"] == "Blue"
    assert openai.types.responses.Response.model_validate(failed).status == "failed"


# --- tools --------------------------------------------------------------------------------------------------------


def test_function_tool_round_trip(client, caplog):
    with caplog.at_level(logging.INFO, logger=rw.__name__):
        r = client.responses.create(model="m", input=ASK, max_output_tokens=64, temperature=0,
                                    tools=[WEATHER, {"type": "web_search"}, {"type": "file_search",
                                                                             "vector_store_ids": ["vs_1"]}],
                                    tool_choice="required")
    assert [rec.getMessage() for rec in caplog.records if "skipped" in rec.getMessage()] == [
        "responses: 2 tools skipped (only function tools run here), of types 'web_search', 'file_search'"]
    [fc] = r.output
    assert fc.type == "function_call" and fc.name == "get_weather" and fc.status == "completed"
    assert fc.id.startswith("fc_") and fc.call_id.startswith("call_")
    assert json.loads(fc.arguments) == {"location": "Paris"}
    assert r.status == "completed" and [t.name for t in r.tools] == ["get_weather"]
    follow = client.responses.create(
        model="m", max_output_tokens=12, temperature=0, tools=[WEATHER], tool_choice="none",
        input=[{"role": "user", "content": ASK}, fc.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": fc.call_id, "output": '{"temperature": 21}'}])
    assert follow.output_text and follow.output[0].type == "message"
    assert follow.usage.input_tokens > r.usage.input_tokens


def test_skipped_tools_are_one_bounded_log_line(caplog):
    """Hosted tools are logged once per request: each type once, cut to 64 characters, 8 of them then how many
    more (a line per tool was unbounded)."""
    tools = [WEATHER, *({"type": f"h{k}_" + "x" * 100} for k in range(50_000)), {"type": "h0_" + "x" * 100}]
    with caplog.at_level(logging.INFO, logger=rw.__name__):
        assert [t["name"] for t in rw.function_tools({"tools": tools})] == ["get_weather"]
    shown = ", ".join(repr(f"h{k}_" + "x" * (64 - len(f"h{k}_"))) for k in range(8))
    assert [rec.getMessage() for rec in caplog.records] == [
        f"responses: 50001 tools skipped (only function tools run here), of types {shown} and 49992 more"]


ALLOWED_BAD = [
    ({"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": ["get_weather"]}]},
     "Field 'tool_choice': allowed_tools.tools[0] needs a non-empty string 'name'"),
    ({"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": {"a": 1}}]},
     "Field 'tool_choice': allowed_tools.tools[0] needs a non-empty string 'name'"),
    ({"type": "allowed_tools", "mode": "auto", "tools": [{"type": "mcp"}, {"type": "function", "name": ""}]},
     "Field 'tool_choice': allowed_tools.tools[1] needs a non-empty string 'name'"),
    ({"type": "allowed_tools", "mode": "auto", "tools": ["get_weather"]},
     "Field 'tool_choice': allowed_tools.tools[0] must be an object"),
    ({"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_time"}]},
     "Field 'tool_choice': allowed_tools with mode 'required' allows none of the request's function tools"),
    ({"type": "allowed_tools", "mode": "required", "tools": []},
     "Field 'tool_choice': allowed_tools with mode 'required' allows none of the request's function tools"),
]


@pytest.mark.parametrize(("choice", "message"), ALLOWED_BAD, ids=range(len(ALLOWED_BAD)))
def test_bad_allowed_tools_are_400s(server, choice, message):
    t0 = time.process_time()
    r = call(server, "POST", "/v1/responses", {"model": "m", "input": ASK, "tools": [WEATHER], "tool_choice": choice})
    assert (r.status, r.json()["error"]) == (400, {"code": 400, "message": message, "type": "invalid_request_error"})
    assert time.process_time() - t0 < 2


def test_required_choices_need_a_function_tool(server):
    message = "Field 'tool_choice': a required or named tool choice needs at least one function tool in 'tools'"
    for extra in ({"tool_choice": "required"}, {"tool_choice": "required", "tools": [{"type": "web_search"}]},
                  {"tool_choice": {"type": "function", "name": "get_weather"}, "tools": []}):
        r = call(server, "POST", "/v1/responses", {"model": "m", "input": ASK, **extra})
        assert (r.status, r.json()["error"]["message"]) == (400, message)


def test_allowed_tools_filter_the_tools():
    other = {**WEATHER, "name": "get_time"}
    tools = rw.function_tools({"tools": [WEATHER, other]})

    def allowed(mode: str, *entries: dict) -> dict:
        body = {"tool_choice": {"type": "allowed_tools", "mode": mode, "tools": list(entries)}}
        out = rw.tool_body(body, tools)
        return {"names": [t["function"]["name"] for t in out["tools"]], "choice": out["tool_choice"]}

    assert allowed("required", {"type": "function", "name": "get_time"}, {"type": "mcp", "server_label": "x"}) == {
        "names": ["get_time"], "choice": "required"}
    assert allowed("auto", {"type": "function", "name": "nope"}) == {"names": [], "choice": None}
    assert allowed("auto", {"type": "function", "name": "get_weather"}, {"type": "function", "name": "get_time"}
                   ) == {"names": ["get_weather", "get_time"], "choice": "auto"}


def test_named_tool_choice_and_streamed_call(client):
    other = {**WEATHER, "name": "get_time", "description": "Get the time in a city"}
    kwargs = {"model": "m", "input": ASK, "max_output_tokens": 64, "temperature": 0, "tools": [other, WEATHER],
              "tool_choice": {"type": "function", "name": "get_weather"}}
    whole = client.responses.create(**kwargs).output[0]
    assert whole.name == "get_weather"
    events = [(ev.type, ev.model_dump()) for ev in client.responses.create(stream=True, **kwargs)]
    response = check_stream(events)
    args = "".join(d["delta"] for name, d in events if name == "response.function_call_arguments.delta")
    [item] = response["output"]
    assert (item["name"], item["arguments"], args) == ("get_weather", whole.arguments, whole.arguments)
    done = [d for name, d in events if name == "response.function_call_arguments.done"]
    assert done[0]["arguments"] == args and done[0]["item_id"] == item["id"]


def test_agents_sdk_over_responses_and_chat_completions(server):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    calls = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return f"It is sunny in {city}."

    async def run_both() -> list:
        oai = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        results = []
        for model in (OpenAIResponsesModel("smol", oai), OpenAIChatCompletionsModel("smol", oai)):
            agent = Agent(name="weather", instructions="Answer weather questions with the tool.", model=model,
                          tools=[get_weather], tool_use_behavior="stop_on_first_tool",
                          model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=64))
            results.append(await Runner.run(agent, ASK, max_turns=3))
        return results

    results = asyncio.run(run_both())
    assert len(calls) == 2 and all(c and isinstance(c, str) for c in calls)
    for result in results:
        assert result.final_output == f"It is sunny in {calls[0]}."
        [call_item] = [i for i in result.new_items if i.type == "tool_call_item"]
        jsonschema.validate(json.loads(call_item.raw_item.arguments), get_weather.params_json_schema)


def test_codex_like_request_streams(server):
    tool = {"type": "function", "strict": False, "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
        "additionalProperties": False}}
    names = ["shell", "read_file", "list_dir", "apply_patch", "update_plan", "view_image", "grep_files"]
    body = {
        "model": "gpt-5.1-codex", "instructions": "You are Codex, a coding agent.", "stream": True,
        "input": [{"type": "message", "role": "developer",
                   "content": [{"type": "input_text", "text": "<permissions>read-only</permissions>"}]},
                  {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List the files."}]}],
        "tools": [*({**tool, "name": n, "description": f"The {n} tool."} for n in names),
                  {"type": "namespace", "name": "mcp__docs", "description": "Docs.", "tools": []},
                  {"type": "web_search", "external_web_access": False}],
        "tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"summary": "auto"}, "store": False,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "0199-abc", "text": {"verbosity": "low"},
        "client_metadata": {"x-codex-turn": "1"}, "service_tier": "auto", "max_output_tokens": 24,
    }
    r = call(server, "POST", "/v1/responses", body)
    assert r.status == 200
    response = check_stream(sse(r.body))
    assert response["store"] is False and len(response["tools"]) == 7 and response["output"]
    openai.types.responses.Response.model_validate(response)  # strictly: every field the SDK requires
    assert call(server, "GET", f"/v1/responses/{response['id']}").status == 404  # store: false keeps nothing


# --- text.format, reasoning ---------------------------------------------------------------------------------------


def test_json_schema_format(client):
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12},
                                               "count": {"type": "integer"}},
              "required": ["colour", "count"], "additionalProperties": False}
    r = client.responses.create(model="m", input=QUESTION, max_output_tokens=48, temperature=0,
                                text={"format": {"type": "json_schema", "name": "colours", "schema": schema,
                                                 "strict": True}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"
    obj = client.responses.create(model="m", input="Give a JSON object with your favourite colour.",
                                  max_output_tokens=48, temperature=0, text={"format": {"type": "json_object"}},
                                  reasoning={"effort": "none"})
    assert obj.status == "completed" and json.loads(obj.output_text) == {"colour": "blue"}
    with pytest.raises(openai.BadRequestError, match="needs its 'schema'"):
        client.responses.create(model="m", input=QUESTION, text={"format": {"type": "json_schema", "name": "x"}})


def test_reasoning_items_in_input(client):
    base = client.responses.create(model="m", max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": QUESTION}])
    with_summary_only = client.responses.create(model="m", max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": "Hi"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "greet"}],
         "encrypted_content": "opaque"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
        {"role": "user", "content": QUESTION}], reasoning={"effort": "high", "summary": "auto"},
        include=["reasoning.encrypted_content"])
    assert with_summary_only.output_text == base.output_text  # dropped: the same prompt
    with_text = client.responses.create(model="m", max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": "Hi"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "A greeting."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
        {"role": "user", "content": QUESTION}])
    assert with_text.output_text == base.output_text  # SmolLM2's ChatML template does not render reasoning
    items = [{"role": "user", "content": "Hi"},
             {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "A greeting."}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
             {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "ok"}]}]
    assert rw.input_messages({"input": items}, [], None) == [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello!"}], "reasoning_content": "A greeting.",
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]


# renders an assistant's reasoning_content, as Qwen3's template does after the last user turn
REASONING_TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{% if m.reasoning_content %}({{ m.reasoning_content }})"
                      "{% endif %}{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")


def test_reasoning_items_reach_the_template(smol):
    """A reasoning item's text reaches the template as the assistant's ``reasoning_content`` (it was dropped on the
    way through the chat messages' checks); OpenAI chat messages keep it too (llama.cpp's
    ``test_anthropic_thinking_history_in_template``, over ``/apply-template``)."""
    hi_bye = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
              {"role": "user", "content": "Bye"}]
    with live_server(smol, n_slots=1, n_ctx=1024, chat_template=REASONING_TEMPLATE) as s:
        thought = {**hi_bye[1], "reasoning_content": "A greeting."}
        r = call(s, "POST", "/apply-template", {"messages": [hi_bye[0], thought, hi_bye[2]]})
        assert r.json() == {"prompt": "<user>Hi\n<assistant>(A greeting.)Hello!\n<user>Bye\n<assistant>"}
        with_reasoning = call(s, "POST", "/v1/responses", {"max_output_tokens": 1, "temperature": 0, "input": [
            hi_bye[0], {"type": "reasoning", "summary": [],
                        "content": [{"type": "reasoning_text", "text": "A greeting."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
            hi_bye[2]]}).json()
        without = call(s, "POST", "/v1/responses", {"max_output_tokens": 1, "temperature": 0, "input": hi_bye}).json()
        # 26 / 22: the tokens of the two prompts, with and without `(A greeting.)`
        assert (with_reasoning["usage"]["input_tokens"], without["usage"]["input_tokens"]) == (26, 22)
        r = call(s, "POST", "/apply-template", {"messages": [{"role": "assistant", "content": "x",
                                                              "reasoning_content": 3}]})
        assert (r.status, r.json()["error"]["message"]) == (400, "messages[0]: 'reasoning_content' must be a string")


# --- the store ----------------------------------------------------------------------------------------------------


def test_previous_response_id_continues(client, server):
    first = client.responses.create(model="m", input="My name is Ada.", max_output_tokens=8, temperature=0,
                                    instructions="Be brief.")
    follow = client.responses.create(model="m", input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=8, temperature=0)
    whole = client.responses.create(model="m", max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}])
    assert follow.previous_response_id == first.id
    assert follow.output_text == whole.output_text  # the instructions are not carried over (OpenAI's rule)
    assert follow.usage.input_tokens == whole.usage.input_tokens
    raw = call(server, "GET", f"/v1/responses/{first.id}").json()
    assert openai.types.responses.Response.model_validate(raw).output_text == first.output_text
    got = client.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text
    ref = client.responses.create(model="m", max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": "My name is Ada."}, {"type": "item_reference", "id": first.output[0].id},
        {"role": "user", "content": "What is my name?"}])
    assert ref.output_text == whole.output_text
    gone = client.responses.create(model="m", input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(gone.id)
    assert client.responses.delete(first.id) is None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


def test_a_follow_up_needs_new_input(client, server):
    """``previous_response_id`` without new input is a 400: the conversation would end with the previous answer,
    which the chat layer continues as a prefill (stored as a second assistant message, it broke every later
    follow-up). A chain of follow-ups keeps working, and so does one after an explicit prefill."""
    first = client.responses.create(model="m", input="My name is Ada.", max_output_tokens=6, temperature=0)
    message = ("Field 'input': a request with 'previous_response_id' needs new input (the previous response's "
               "conversation ends with its answer)")
    for extra in ({}, {"input": []}, {"input": None}):
        t0 = time.process_time()
        r = call(server, "POST", "/v1/responses", {"model": "m", "previous_response_id": first.id,
                                                   "max_output_tokens": 4, **extra})
        assert (r.status, r.json()["error"]) == (400, {"code": 400, "message": message,
                                                       "type": "invalid_request_error"})
        assert time.process_time() - t0 < 2
    turns = [first]
    for text in ("What is my name?", "Say it again."):
        turns.append(client.responses.create(model="m", input=text, previous_response_id=turns[-1].id,
                                             max_output_tokens=6, temperature=0))
        assert turns[-1].status in ("completed", "incomplete") and turns[-1].output_text
    history = server.state.responses.get(turns[-1].id).history
    assert [m["role"] for m in history] == ["user", "assistant"] * 3
    # a prefill (input ending with the assistant's words) is continued, and stored as one assistant message
    prefill = client.responses.create(model="m", max_output_tokens=4, temperature=0, input=[
        {"role": "user", "content": QUESTION}, {"role": "assistant", "content": "The colours are"}])
    stored = server.state.responses.get(prefill.id).history
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[-1]["content"] == "The colours are" + prefill.output_text
    after = client.responses.create(model="m", input="And two more?", previous_response_id=prefill.id,
                                    max_output_tokens=4, temperature=0)
    assert after.status in ("completed", "incomplete") and after.output_text


def test_stored_history_merges_a_continued_answer():
    user = {"role": "user", "content": "Hi"}
    answer = {"role": "assistant", "content": " there", "reasoning_content": "r",
              "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert rw.answered([user], answer) == [user, answer]
    assert rw.answered([user], None) == [user]
    prefill = {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert rw.answered([user, prefill], answer) == [user, {**answer, "content": "a\n\nb there"}]
    assert rw.answered([user, prefill], None) == [user, prefill]


def test_input_is_bounded_in_parts_and_messages(server):
    """Content parts in all and messages (the previous response's conversation included) within MAX_MESSAGES,
    counted before the items are read."""
    t0 = time.process_time()
    parts = [{"type": "input_text", "text": "a"}] * 100_000
    r = call(server, "POST", "/v1/responses", {"model": "m", "input": [{"role": "user", "content": parts}]})
    assert (r.status, r.json()["error"]["message"]) == (400, "Field 'input': at most 4096 content parts in all, "
                                                             "got 100000")
    outputs = [{"type": "function_call_output", "call_id": "c", "output": parts[:2049]}] * 2
    r = call(server, "POST", "/v1/responses", {"model": "m", "input": outputs})
    assert (r.status, r.json()["error"]["message"]) == (400, "Field 'input': at most 4096 content parts in all, "
                                                             "got 4098")
    r = call(server, "POST", "/v1/responses", {"model": "m", "input": [{"role": "user", "content": "x"}] * 4097})
    assert (r.status, r.json()["error"]["message"]) == (400, "Field 'input': at most 4096 items, got 4097")
    assert time.process_time() - t0 < 3
    history = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}] * 2000
    with pytest.raises(rw.APIError) as e:
        rw.input_messages({"input": [{"role": "user", "content": "z"}] * 97}, history, None)
    assert (e.value.code, e.value.message) == (400, "Field 'input': at most 4096 messages, got 4097 (the items as "
                                                    "chat messages, after the previous response's conversation)")
    assert len(rw.input_messages({"input": [{"role": "user", "content": "z"}] * 96}, history, None)) == 4096


def test_reasoning_tokens_are_counted_off_the_event_loop(client, monkeypatch):
    """The answer's last parse and the count of its reasoning's tokens run in a worker thread, streamed or not."""
    from samplechain.server import routes_responses

    loops = []
    real = routes_responses.count_tokens

    def counting(state, text):
        try:
            asyncio.get_running_loop()
            loops.append(True)
        except RuntimeError:
            loops.append(False)
        return real(state, text)

    monkeypatch.setattr(routes_responses, "count_tokens", counting)
    client.responses.create(model="m", input="Hi", max_output_tokens=2, temperature=0)
    list(client.responses.create(model="m", input="Hi", max_output_tokens=2, temperature=0, stream=True))
    assert loops == [False, False]


def test_unknown_ids_are_openai_404s(client, server):
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="m", input="Hi", previous_response_id="resp_unknown")
    assert e.value.body["message"] == "Response with id 'resp_unknown' not found."
    r = call(server, "GET", "/v1/responses/resp_nope")
    assert r.status == 404 and r.json() == {"error": {"code": 404, "message": "Response with id 'resp_nope' not "
                                                      "found.", "type": "invalid_request_error", "param": None}}


def test_store_is_bounded():
    store = rw.ResponseStore(2)
    for k in range(3):
        store.put(f"r{k}", rw.Stored({"id": f"r{k}"}, [], {f"msg_{k}": {"id": f"msg_{k}"}}))
    assert store.get("r0") is None and store.item("msg_0") is None
    assert store.get("r1") is not None  # used: r2 goes first now
    store.put("r3", rw.Stored({}, []))
    assert (store.get("r2"), store.get("r1") is not None, store.item("msg_1")) == (None, True, {"id": "msg_1"})
    empty = rw.ResponseStore(0)  # --responses-store 0: nothing is kept
    empty.put("x", rw.Stored({}, []))
    assert empty.get("x") is None and not empty.entries


# --- bad input ----------------------------------------------------------------------------------------------------

BAD = [
    ({}, "'input' is required"),
    ({"input": 3}, "'input' must be a string or an array"),
    ({"input": [3]}, "input[0]: an input item must be an object"),
    ({"input": [{"role": "robot", "content": "x"}]}, "'role' must be one of"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "images need a vision model"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "'input_file' is not"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "'text' must be a string"),
    ({"input": [{"role": "user", "content": 5}]}, "'content' must be a string or an array"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "a function_call needs"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": 3}]}, "'output' must be a string"),
    ({"input": [{"type": "item_reference", "id": "msg_unknown"}]}, "no stored item with id"),
    ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "unsupported input item type"),
    ({"input": "x", "tools": [{"type": "function"}]}, "needs a non-empty string 'name'"),
    ({"input": "x", "tools": {"type": "function"}}, "'tools' must be an array"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": "sometimes"}, "Field 'tool_choice'"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "not one of the tools"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "web_search_preview"}}, "do not run here"),
    ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format: 'type' must be one of"),
    ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"input": "x", "max_output_tokens": 0}, "'max_output_tokens': must be a positive integer"),
    ({"input": "x", "max_output_tokens": "8"}, "'max_output_tokens': must be a positive integer"),
    ({"input": "x", "temperature": "hot"}, "temperature"),
    ({"input": "x", "store": "yes"}, "Field 'store'"),
    ({"input": "x", "background": True}, "background responses are not supported"),
    ({"input": "x", "instructions": ["a"]}, "Field 'instructions'"),
]


@pytest.mark.parametrize(("body", "message"), BAD, ids=[m for _, m in BAD])
def test_malformed_requests_are_400s(server, body, message):
    t0 = time.process_time()
    r = call(server, "POST", "/v1/responses", {"model": "m", **body})
    assert (r.status, r.json()["error"]["type"]) == (400, "invalid_request_error")
    assert message in r.json()["error"]["message"]
    assert time.process_time() - t0 < 2


# --- more requests than slots -------------------------------------------------------------------------------------


def test_more_requests_than_slots_and_a_client_that_leaves(server):
    results: dict[int, object] = {}

    def one(k: int) -> None:
        body = {"model": "m", "input": f"Count to {k + 3}.", "max_output_tokens": 12, "temperature": 0,
                "stream": k % 2 == 0}
        r = call(server, "POST", "/v1/responses", body)
        results[k] = check_stream(sse(r.body)) if body["stream"] else r.json()

    def leaver() -> None:  # reads the first events of a long answer, then hangs up
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request("POST", "/v1/responses", json.dumps({"input": "Write a long story.", "stream": True,
                                                          "max_output_tokens": 1500}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and b"response.created" in resp.read1(4096)
        conn.sock.close()
        conn.close()

    threads = [threading.Thread(target=leaver)] + [threading.Thread(target=one, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == list(range(6))
    for response in results.values():
        assert response["status"] == "incomplete" and response["usage"]["output_tokens"] == 12
    deadline = time.monotonic() + 30  # the leaver's task was cancelled: every slot is free again
    while any(s["is_processing"] for s in call(server, "GET", "/slots").json()):
        assert time.monotonic() < deadline
        time.sleep(0.1)
