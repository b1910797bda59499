"""Tool calls (llama.cpp's common/chat.cpp): each format's detection, prompt, grammar and parser on real templates
(llama.cpp's ``models/templates``, cases from its ``tests/test-chat.cpp`` and minja's polyfill tests), and the OpenAI
client's round trip against our server with SmolLM2 (generic format: its template renders no tools)."""

import copy
import json
from pathlib import Path

import jsonschema
import pytest
from tests.server.conftest import live_server

from samplechain.chat import ChatMessage as ParsedMessage
from samplechain.chat import ChatSyntax, MessageStream, ToolCall, parse_tool_request
from samplechain.chat.formats import (
    GENERIC,
    HERMES_2_PRO,
    LLAMA_3_X,
    LLAMA_3_X_BUILTIN,
    MISTRAL_NEMO,
    ToolSetup,
    detect,
)
from samplechain.chat.parse import parse_content
from samplechain.chat.template import BUILTIN_TEMPLATES
from samplechain.grammar.engine import Grammar
from samplechain.server import prompts
from samplechain.server.limits import APIError
from samplechain.server.responses import oai_deltas

TEMPLATES = Path(__file__).parent.parent / "fixtures" / "templates"
HERMES_2 = "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja"
QWEN_25 = "Qwen-Qwen2.5-7B-Instruct.jinja"
QWEN_3 = "Qwen-Qwen3-0.6B.jinja"
LLAMA_31 = "meta-llama-Llama-3.1-8B-Instruct.jinja"
NEMO = "mistralai-Mistral-Nemo-Instruct-2407.jinja"

SPECIAL = {"type": "function", "function": {"name": "special_function", "description": "I'm special", "parameters": {
    "type": "object", "properties": {"arg1": {"type": "integer", "description": "The arg."}}, "required": ["arg1"]}}}
WEATHER = {"type": "function", "function": {"name": "get_current_weather", "description": "Get the current weather",
                                            "parameters": {"type": "object", "properties": {
                                                "location": {"type": "string", "description": "The city"},
                                                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                                                "required": ["location", "unit"]}}}
CALL = ParsedMessage("", [ToolCall("special_function", '{"arg1": 1}')])


def source(name: str) -> str:
    return (TEMPLATES / name).read_text()


def parse_message(fmt, text, partial=False):
    return parse_content(ChatSyntax(fmt, True), text, partial)


def detect_format(src, req, schema):
    return detect(src, req, schema).name


def request(*tools, choice="auto", parallel=None):
    body = {"tools": list(tools), "tool_choice": choice}
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    return parse_tool_request(body)


# --- formats --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("template", "schema", "expected"), [
    (HERMES_2, None, HERMES_2_PRO), (QWEN_25, None, HERMES_2_PRO), (QWEN_3, None, HERMES_2_PRO),
    (LLAMA_31, None, LLAMA_3_X_BUILTIN), (NEMO, None, MISTRAL_NEMO), (QWEN_25, {"type": "object"}, GENERIC),
])
def test_format_follows_the_template(template, schema, expected):
    assert detect_format(source(template), request(SPECIAL), schema) == expected


def test_format_of_other_templates_is_generic_and_none_is_content_only():
    chatml = BUILTIN_TEMPLATES["chatml"]
    assert detect_format(chatml, request(SPECIAL), None) == GENERIC
    assert detect_format(chatml, request(SPECIAL, choice="none"), None) == "Content-only"
    assert detect_format(source(NEMO), None, None) == "Content-only"


@pytest.mark.parametrize(("fmt", "text", "expected"), [
    # test-chat.cpp's cases
    (HERMES_2_PRO, '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}</tool_call>', CALL),
    (HERMES_2_PRO, '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>', CALL),
    (HERMES_2_PRO, 'Hello, world!\nWhat\'s up?<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}'
                   '</tool_call>',
     ParsedMessage("Hello, world!\nWhat's up?", [ToolCall("special_function", '{"arg1": 1}')])),
    (HERMES_2_PRO, '<function=special_function>{"arg1": 1}</function>', CALL),
    (HERMES_2_PRO, '```json\n<tool_call>{"name": "special_function", "arguments": {"arg1": 1}}</tool_call>```', CALL),
    (HERMES_2_PRO, "Hello, world!\nWhat's up?", ParsedMessage("Hello, world!\nWhat's up?")),
    (HERMES_2_PRO, '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "arguments": '
                   '{"x": [1, "}"]}}</tool_call>',
     ParsedMessage("", [ToolCall("a", "{}"), ToolCall("b", '{"x": [1, "}"]}')])),
    (MISTRAL_NEMO, '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]',
     ParsedMessage("", [ToolCall("special_function", '{"arg1": 1}', "123456789")])),
    (LLAMA_3_X, '{"name": "special_function", "parameters": {"arg1": 1}}', CALL),
    (LLAMA_3_X, '{"type": "function", "name": "special_function", "parameters":{"arg1": 1}}', CALL),
    (LLAMA_3_X, "Hello, world!\nWhat's up?", ParsedMessage("Hello, world!\nWhat's up?")),
    (LLAMA_3_X_BUILTIN, '<|python_tag|>python.call(code="print(\'hey\')")',
     ParsedMessage("", [ToolCall("python", '{"code":"print(\'hey\')"}')])),
    (GENERIC, '{"tool_call": {"name": "special_function", "arguments": {"arg1": 1}}}', CALL),
    (GENERIC, '{"tool_calls": [{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]}',
     ParsedMessage("", [ToolCall("special_function", '{"arg1": 1}', "123456789")])),
    (GENERIC, '{"response": "Hello, world!\\nWhat\'s up?"}', ParsedMessage("Hello, world!\nWhat's up?")),
])
def test_parse(fmt, text, expected):
    assert parse_message(fmt, text) == expected


@pytest.mark.parametrize(("fmt", "text"), [
    (HERMES_2_PRO, '<tool_call>{"name": "special_function", "arguments": {"arg1": 1}'),  # cut short
    (HERMES_2_PRO, '<tool_call>{"name": "special_function", "arguments": {"arg1": 1}}</tool'),
    (MISTRAL_NEMO, '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": }}]'),  # not JSON
    (GENERIC, '{"response": "unfinished'),
    (GENERIC, "plain text"),
])
def test_a_final_answer_without_the_format_is_content(fmt, text):
    assert parse_message(fmt, text) == ParsedMessage(text)


@pytest.mark.parametrize(("fmt", "text"), [
    (HERMES_2_PRO, 'Let me check. <tool_call>\n{"name": "get_current_weather", "arguments": {"location": "Paris, '
                   'France", "unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": "special_function", '
                   '"arguments": {"arg1": 12}}\n</tool_call>'),
    (MISTRAL_NEMO, '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}, {"name": '
                   '"get_current_weather", "arguments": {"location": "\\u00e9\\"t\\u00e9", "unit": "celsius"}, '
                   '"id": "abcdefghi"}]'),
    (LLAMA_3_X, '{"name": "special_function", "parameters": {"arg1": 1}}'),
    (GENERIC, '{"tool_calls": [{"name": "special_function", "arguments": {"arg1": 1}, "id": "call"}]}'),
    (GENERIC, '{"response": "caf\\u00e9 \\"ok\\"\\n"}'),
])
def test_stream_deltas_add_up_to_the_message(fmt, text):
    stream = MessageStream(ChatSyntax(fmt, True, extract_reasoning=False))
    deltas = [d for i in range(0, len(text), 3) for d in oai_deltas(stream.update(text[i:i + 3]), False)]
    deltas += oai_deltas(stream.update("", final=True), False)
    final = parse_message(fmt, text)
    content, calls = "", {}
    for d in deltas:
        content += d.get("content", "")
        for call in d.get("tool_calls", []):
            if call["index"] not in calls:  # the first delta of a call: id, type and name
                assert set(call) >= {"id", "type"} and call["function"]["name"]
                calls[call["index"]] = {"id": call["id"], "name": call["function"]["name"], "arguments": ""}
            else:
                assert set(call) == {"index", "function"} and set(call["function"]) == {"arguments"}
            calls[call["index"]]["arguments"] += call.get("function", {}).get("arguments", "")
    assert content == final.content
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [(c.name, c.arguments) for c in final.tool_calls]
    assert [c["id"] for c in calls.values()] == [c.id for c in stream.msg.tool_calls]


def fmt_of(template, req, json_schema=None):
    """A format's grammar and triggers (the prompt is not looked at)."""
    fmt = detect(source(template) if template else "", req, json_schema)
    return fmt.params(ToolSetup(req, req.choice == "required", bool(req.parallel), json_schema))


@pytest.mark.parametrize(("template", "choice", "good", "bad"), [
    (HERMES_2, "required", '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>',
     '<tool_call>\n{"name": "special_function", "arguments": {"arg1": "1"}}\n</tool_call>'),
    (HERMES_2, "auto", '<function=special_function>{"arg1": 1}</function>',
     '<function=other>{"arg1": 1}</function>'),
    (NEMO, "required", '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]',
     '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "12345678"}]'),
    (LLAMA_31, "auto", '{"name": "special_function", "parameters": {"arg1": 1}}',
     '{"name": "special_function", "parameters": {}}'),
    (None, "required", '{"tool_call": {"name": "special_function", "arguments": {"arg1": 1}}}',
     '{"response": "hi"}'),
    (None, "auto", '{"response": "hi"}', '{"tool_call": {"name": "special_function", "arguments": {"arg2": 1}}}'),
])
def test_grammar_takes_calls_valid_for_the_schema(template, choice, good, bad):
    fmt = fmt_of(template, request(SPECIAL, choice=choice, parallel=False))
    assert fmt.grammar_lazy == (choice == "auto" and template is not None)

    def accepts(text):
        m = Grammar.from_gbnf(fmt.grammar).matcher()
        return m.accept_str(text) and m.is_accepting()

    assert accepts(good)
    assert not accepts(bad)


def test_triggers_and_preserved_tokens_as_llama_cpp_sets_them():
    nemo = fmt_of(NEMO, request(SPECIAL))
    assert (nemo.triggers, nemo.preserved_tokens) == (((1, "[TOOL_CALLS]"),), ("[TOOL_CALLS]",))
    hermes = fmt_of(QWEN_25, request(SPECIAL))
    assert hermes.triggers[:2] == ((1, "<function=special_function>"),
                                   (2, r'<function\s+name\s*=\s*"special_function"'))
    assert hermes.triggers[2] == (3, r"(?:<think>[\s\S]*?</think>\s*)?(\s*(?:<tool_call>|<function|(?:```(?:json|xml)?"
                                     "\n" r'\s*)?(?:<function_call>|<tools>|<xml><json>|<response>)?\s*\{\s*"name"\s*:'
                                     r'\s*"(?:special_function)"))[\s\S]*')
    llama = fmt_of(LLAMA_31, request(SPECIAL))
    assert (llama.triggers, llama.stops) == (((3, r'(\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*")[\s\S]*'),),
                                             ("<|eom_id|>",))
    assert not fmt_of(None, request(SPECIAL)).grammar_lazy  # generic: JSON from the first token


@pytest.mark.parametrize(("body", "message"), [
    ({"tools": [SPECIAL], "tool_choice": "sometimes"}, "Invalid tool_choice: sometimes"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]: Unsupported tool type"),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "function.name must be a non-empty"),
    ({"tools": [SPECIAL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "the function 'nope' is not one of the tools"),
    ({"tools": [SPECIAL], "parallel_tool_calls": "yes"}, "Field 'parallel_tool_calls': must be true or false"),
])
def test_bad_tool_fields_are_a_400(body, message):
    with pytest.raises(APIError) as e:
        prompts.tool_request(body)
    assert e.value.code == 400 and message in e.value.message


def test_a_named_function_is_required_and_alone():
    req = parse_tool_request({"tools": [SPECIAL, WEATHER], "tool_choice": {"type": "function", "function": {
        "name": "get_current_weather"}}})
    assert req.choice == "required" and [t["function"]["name"] for t in req.tools] == ["get_current_weather"]


# --- prompts on real templates (SmolLM2's vocabulary: ChatML's BOS/EOS texts) ----------------------------------


def with_template(model, text):
    vocab = copy.copy(model.vocab)
    vocab.chat_template = text
    out = copy.copy(model)
    out.vocab = vocab
    return out


USER = {"role": "user", "content": "I need help"}
ASSISTANT_CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"type": "function", "id": "123456789", "function": {"name": "special_function", "arguments": '{"arg1": 1}'}}]}
TOOL_RESULT = {"role": "tool", "tool_call_id": "123456789", "name": "special_function", "content": "42"}


def test_tools_polyfill_for_a_template_without_tools(smol):
    # minja's PolyfillTest.ToolsPolyfill: the tools and an example call in the system prompt
    chatml = with_template(smol, BUILTIN_TEMPLATES["chatml"])
    setup = prompts.chat_setup(chatml, {"messages": [USER], "tools": [SPECIAL], "tool_choice": "none"})
    assert setup.prompt == (
        "<|im_start|>system\nYou can call any of the following tools to satisfy the user's requests: "
        + json.dumps([SPECIAL], indent=2) + "\n\nExample tool call syntax:\n\n"
        '{\n  "tool_calls": [\n    {\n      "name": "tool_name",\n      "arguments": {\n        "arg1": "some_value"\n'
        '      },\n      "id": "call_1___"\n    }\n  ]\n}\n\n<|im_end|>\n<|im_start|>user\nI need help<|im_end|>\n'
        "<|im_start|>assistant\n")
    generic = prompts.chat_setup(chatml, {"messages": [USER], "tools": [SPECIAL]})
    assert generic.format.name == GENERIC and generic.prompt.startswith(
        "<|im_start|>system\nRespond in JSON format, either with `tool_call` (a request to call tools) or with "
        "`response` reply to the user's request\n\nYou can call any of the following tools")


def test_tool_call_and_result_polyfills(smol):
    # minja's PolyfillTest.ToolCallPolyfill and ToolPolyfill: calls and results as JSON messages
    chatml = with_template(smol, BUILTIN_TEMPLATES["chatml"])
    setup = prompts.chat_setup(chatml, {"messages": [USER, ASSISTANT_CALL, TOOL_RESULT]})
    assert setup.prompt == (
        '<|im_start|>user\nI need help<|im_end|>\n<|im_start|>assistant\n{\n  "tool_calls": [\n    {\n      "name": '
        '"special_function",\n      "arguments": {\n        "arg1": 1\n      },\n      "id": "123456789"\n    }\n  ]\n'
        '}<|im_end|>\n<|im_start|>user\n{\n  "tool_response": {\n    "tool": "special_function",\n    "content": "42",'
        '\n    "tool_call_id": "123456789"\n  }\n}<|im_end|>\n<|im_start|>assistant\n')


@pytest.mark.parametrize(("template", "call", "result"), [
    (HERMES_2, '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call><|im_end|>',
     "<|im_start|>tool\n<tool_response>\n42\n</tool_response>\n<|im_end|>"),
    (QWEN_25, '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call><|im_end|>',
     "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>"),
    (QWEN_3, '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call><|im_end|>',
     "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>"),
    # object arguments (the template renders objects only): not a JSON string inside JSON
    (LLAMA_31, '{"name": "special_function", "parameters": {"arg1": 1}}<|eot_id|>',
     '<|start_header_id|>ipython<|end_header_id|>\n\n"42"<|eot_id|>'),
    (NEMO, '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]<|im_end|>',
     '[TOOL_RESULTS]{"content": 42, "call_id": "123456789"}[/TOOL_RESULTS]'),
])
def test_real_templates_render_tools_calls_and_results(smol, template, call, result):
    # (the EOS text is SmolLM2's: <|im_end|>)
    model = with_template(smol, source(template))
    answer = {"role": "assistant", "content": "The answer is 42."}
    setup = prompts.chat_setup(model, {"messages": [USER, ASSISTANT_CALL, TOOL_RESULT, answer,
                                                    {"role": "user", "content": "Again"}], "tools": [SPECIAL]})
    assert call in setup.prompt and result in setup.prompt
    assert "I'm special" in setup.prompt  # the tools are described
    assert setup.format.grammar


def test_continuing_a_tool_call_message_is_a_400(smol):
    with pytest.raises(APIError) as e:
        prompts.chat_setup(smol, {"messages": [USER, ASSISTANT_CALL], "tools": [SPECIAL]})
    assert e.value.message == "Cannot continue an assistant message that contains tool calls."


# --- end to end: the openai client, SmolLM2 (generic format) --------------------------------------------------


@pytest.fixture(scope="module")
def client(smol):
    import openai

    with live_server(smol, n_slots=4, n_ctx=8192) as s:
        yield openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)


ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_call(call, tool, own_id=False):
    """A call of ``tool`` whose arguments validate; its id is ours (32 characters) unless the format has the model
    write one (parallel generic calls: at least 4 characters)."""
    assert call.type == "function" and call.function.name == tool["function"]["name"]
    assert len(call.id) >= 4 if own_id else len(call.id) == 32
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


def test_required_calls_the_tool_with_valid_arguments(client):
    r = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], tool_choice="required",
                                       max_tokens=64, seed=3)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == ""
    assert len(choice.message.tool_calls) == 1
    check_call(choice.message.tool_calls[0], WEATHER)


def test_named_function(client):
    r = client.chat.completions.create(model="m", messages=ASK, tools=[SPECIAL, WEATHER], max_tokens=64, seed=3,
                                       tool_choice={"type": "function", "function": {"name": "special_function"}})
    [call] = r.choices[0].message.tool_calls
    check_call(call, SPECIAL)


def test_none_and_no_tools_give_text(client):
    for extra in ({"tools": [WEATHER], "tool_choice": "none"}, {}):
        r = client.chat.completions.create(model="m", messages=ASK, max_tokens=8, seed=3, **extra)
        assert r.choices[0].message.tool_calls is None and r.choices[0].message.content


def test_auto_answers_or_calls(client):
    r = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], max_tokens=64, seed=3,
                                       temperature=0)
    message = r.choices[0].message
    if message.tool_calls:  # the generic format's grammar: a call, or a response
        check_call(message.tool_calls[0], WEATHER)
    else:
        assert message.content and not message.content.startswith('{"response"')


def test_parallel_calls_are_an_array(client):
    r = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, SPECIAL], tool_choice="required",
                                       parallel_tool_calls=True, max_tokens=96, seed=3)
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and len(calls) >= 1
    for call in calls:
        check_call(call, WEATHER if call.function.name == WEATHER["function"]["name"] else SPECIAL, own_id=True)


def test_streamed_deltas_reassemble_to_the_answer(client):
    kwargs = {"model": "m", "messages": ASK, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 64,
              "seed": 5}
    whole = client.chat.completions.create(**kwargs).choices[0].message.tool_calls[0]
    name, args, ids, finish = None, "", set(), None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for call in choice.delta.tool_calls or ():
            assert call.index == 0
            if call.id:
                ids.add(call.id)
                name = call.function.name
            args += call.function.arguments or ""
    assert (name, args, finish, len(ids)) == (whole.function.name, whole.function.arguments, "tool_calls", 1)


def test_round_trip_with_a_tool_result(client):
    first = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], tool_choice="required",
                                           max_tokens=64, seed=3).choices[0].message
    call = first.tool_calls[0]
    messages = [*ASK, first.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}]
    r = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER], tool_choice="none",
                                       max_tokens=8, seed=3)
    assert r.choices[0].message.content and r.choices[0].message.tool_calls is None
    assert r.usage.prompt_tokens > 300  # the call and its result are in the prompt


def test_seeded_batch_always_valid(client):
    # a smaller version of benchmarks/bench_tool_calls.py: every answer is a call whose arguments validate
    parsed = 0
    for seed in (11, 12):
        r = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], tool_choice="required", n=4,
                                           max_tokens=64, seed=seed, temperature=1.0)
        for choice in r.choices:
            assert choice.finish_reason == "tool_calls"
            check_call(choice.message.tool_calls[0], WEATHER)
            parsed += 1
    assert parsed == 8
