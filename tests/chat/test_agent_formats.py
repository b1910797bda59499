# ruff: noqa: RUF001  (DeepSeek's markers are full-width characters)
"""The tool-call formats agents meet (llama.cpp's ``common/chat.cpp``: ``common_chat_params_init_*`` and its
parsers): DeepSeek R1 and V3.1, Qwen3-Coder's XML, GPT-OSS's harmony channels, Command R7B, Functionary v3.2 and
FireFunction v2. Each one: detection from its real template (llama.cpp's ``models/templates``), the parse cases of
llama.cpp's ``tests/test-chat.cpp`` (whole text -> message), a streamed parse whose deltas add up to the whole one, its
lazy grammar on a call valid for the schema and one that is not, and the prompt with the tools, a call and its
result as the template renders them.

Arguments are kept as generated (test-chat.cpp compares them re-serialized), so ``{"arg1": 1}`` stays as written."""

import json

import pytest

from llama_tree import template_file
from samplechain.chat import (
    ChatMessage,
    ChatOptions,
    ChatSyntax,
    ChatTemplate,
    MessageStream,
    ToolCall,
    apply,
    parse_tool_request,
)
from samplechain.chat import parse as parse_answer
from samplechain.chat.formats import (
    COMMAND_R7B,
    DEEPSEEK_R1,
    DEEPSEEK_V3_1,
    FIREFUNCTION_V2,
    FUNCTIONARY_V3_2,
    GENERIC,
    GPT_OSS,
    QWEN3_CODER_XML,
    ToolSetup,
    by_name,
    detect,
)
from samplechain.grammar.engine import Grammar
from samplechain.params.checks import TRIGGER_PATTERN, TRIGGER_PATTERN_FULL, TRIGGER_WORD

DS_BOS, DS_EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
TEMPLATES = {  # name -> (template file, BOS text, EOS text)
    DEEPSEEK_R1: ("llama-cpp-deepseek-r1", DS_BOS, DS_EOS),
    DEEPSEEK_V3_1: ("deepseek-ai-DeepSeek-V3.1", DS_BOS, DS_EOS),
    QWEN3_CODER_XML: ("Qwen3-Coder", "", "<|im_end|>"),
    GPT_OSS: ("openai-gpt-oss-120b", "<|startoftext|>", "<|return|>"),
    COMMAND_R7B: ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    FUNCTIONARY_V3_2: ("meetkai-functionary-medium-v3.2", "<|begin_of_text|>", "<|eot_id|>"),
    FIREFUNCTION_V2: ("fireworks-ai-llama-3-firefunction-v2", "<|begin_of_text|>", "<|eot_id|>"),
}

SPECIAL = {"type": "function", "function": {"name": "special_function", "description": "I'm special", "parameters": {
    "type": "object", "properties": {"arg1": {"type": "integer", "description": "The arg."}}, "required": ["arg1"]}}}
PYTHON = {"type": "function", "function": {"name": "python", "description": "an ipython interpreter", "parameters": {
    "type": "object", "properties": {"code": {"type": "string", "description": "Python code to execute."}},
    "required": ["code"]}}}
EDIT = {"type": "function", "function": {"name": "edit", "description": "Edit a file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "count": {"type": "integer"}},
    "required": ["path"]}}}
CALL = ChatMessage("", [ToolCall("special_function", '{"arg1": 1}')])
HELLO = "Hello, world!\nWhat's up?"
THOUGHTS = ChatMessage(HELLO, reasoning_content="I'm\nthinking")
USER = {"role": "user", "content": "I need help"}
ASSISTANT_CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"type": "function", "id": "123456789", "function": {"name": "special_function", "arguments": '{"arg1": 1}'}}]}
TOOL_RESULT = {"role": "tool", "tool_call_id": "123456789", "name": "special_function", "content": "42"}


def template(fmt: str) -> ChatTemplate:
    name, bos, eos = TEMPLATES[fmt]
    return ChatTemplate(template_file(name).read_text(), bos, eos)


def request(*tools, choice="auto", parallel=None):
    body = {"tools": list(tools), "tool_choice": choice}
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    return parse_tool_request(body)


def syntax(fmt: str, thinking_open: bool = False, extract_reasoning: bool = True) -> ChatSyntax:
    tags = by_name(fmt).reasoning
    return ChatSyntax(fmt, True, tags or ("<think>", "</think>"), tags is not None and extract_reasoning,
                      thinking_open)


# --- detection ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(TEMPLATES))
def test_detected_from_the_real_template(fmt):
    source = template(fmt).source
    assert detect(source, request(SPECIAL), None).name == fmt
    assert apply(template(fmt), [USER], request(SPECIAL)).format.name == fmt


@pytest.mark.parametrize(("fmt", "without_tools"), [
    (DEEPSEEK_R1, DEEPSEEK_R1), (DEEPSEEK_V3_1, DEEPSEEK_V3_1), (COMMAND_R7B, COMMAND_R7B), (GPT_OSS, GPT_OSS),
    (FUNCTIONARY_V3_2, FUNCTIONARY_V3_2), (FIREFUNCTION_V2, FIREFUNCTION_V2), (QWEN3_CODER_XML, QWEN3_CODER_XML),
])
def test_formats_the_template_implies_without_tools(fmt, without_tools):
    assert detect(template(fmt).source, None, None).name == without_tools


def test_a_response_schema_with_tools_is_generic_except_where_llama_cpp_keeps_the_format():
    schema = {"type": "object"}
    for fmt in (DEEPSEEK_R1, DEEPSEEK_V3_1, COMMAND_R7B, FUNCTIONARY_V3_2, FIREFUNCTION_V2):
        assert detect(template(fmt).source, request(SPECIAL), schema).name == GENERIC
    for fmt in (QWEN3_CODER_XML, GPT_OSS):  # checked before the generic fallback, without the schema condition
        assert detect(template(fmt).source, request(SPECIAL), schema).name == fmt


def test_deepseek_r1_official_template_forces_thinking_open():
    official = ChatTemplate(template_file("deepseek-ai-DeepSeek-R1-Distill-Llama-8B").read_text(), DS_BOS, DS_EOS)
    for tools in (None, request(SPECIAL)):
        params = apply(official, [USER], tools)
        assert params.format.name == DEEPSEEK_R1 or tools is None
        assert params.syntax.thinking_open and params.prompt.endswith("<｜Assistant｜><think>\n")
    closed = apply(official, [USER], None, ChatOptions(enable_thinking=False))
    assert closed.prompt.endswith("<｜Assistant｜><think>\n</think>") and not closed.syntax.thinking_open


# --- parsing: test-chat.cpp's cases ----------------------------------------------------------------------------

DS_CALL = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n```json\n{\"arg1\": 1}\n"
           "```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
V31_TIME = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"city\": \"{C}\"}<｜tool▁call▁end｜>"
R7B_ACTION = ('<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "special_function", "parameters": {"arg1": 1}}'
              "\n]<|END_ACTION|>")
PARSE_CASES = [
    # DeepSeek R1 (llama-cpp-deepseek-r1.jinja and the Distill templates)
    (DEEPSEEK_R1, {}, "<think>I'm\nthinking</think>" + HELLO, THOUGHTS),
    (DEEPSEEK_R1, {"thinking_open": True}, "I'm\nthinking</think>" + HELLO, THOUGHTS),
    (DEEPSEEK_R1, {"thinking_open": True}, "</think>" + HELLO, ChatMessage(HELLO)),
    (DEEPSEEK_R1, {"extract_reasoning": False}, "<think>I'm\nthinking</think>" + HELLO,
     ChatMessage("<think>I'm\nthinking</think>" + HELLO)),
    (DEEPSEEK_R1, {}, "<think>I'm\nthinking</think>\n\n" + DS_CALL,
     ChatMessage("", [ToolCall("special_function", '{"arg1": 1}')], "I'm\nthinking")),
    (DEEPSEEK_R1, {}, "<｜tool▁calls｜>function<｜tool▁sep｜>special_function\n```json\n{\"arg1\": 1}\n```"
                      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>", CALL),
    (DEEPSEEK_R1, {"thinking_open": True}, "</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
                                          "special_function\n```json\n{\"arg1\": 1}```<｜tool▁call▁end｜>"
                                          "<｜tool▁calls▁end｜>", CALL),
    # DeepSeek V3.1
    (DEEPSEEK_V3_1, {}, V31_TIME.replace("{C}", "XYZCITY") + "<｜tool▁calls▁end｜>",
     ChatMessage("", [ToolCall("get_time", '{"city": "XYZCITY"}')])),
    (DEEPSEEK_V3_1, {"thinking_open": True}, "REASONING</think>" + V31_TIME.replace("{C}", "Tokyo")
     + "<｜tool▁calls▁end｜>", ChatMessage("", [ToolCall("get_time", '{"city": "Tokyo"}')], "REASONING")),
    (DEEPSEEK_V3_1, {"thinking_open": True}, "REASONING</think>CONTENT" + V31_TIME.replace("{C}", "Paris")
     + "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     ChatMessage("CONTENT", [ToolCall("get_time", '{"city": "Paris"}'), ToolCall("get_weather", '{"city": "Paris"}')],
                 "REASONING")),
    (DEEPSEEK_V3_1, {"thinking_open": True}, "REASONING</think>\nCONTENT", ChatMessage("CONTENT", [], "REASONING")),
    (DEEPSEEK_V3_1, {}, "CONTENT", ChatMessage("CONTENT")),
    # Qwen3-Coder: string values raw, the others JSON
    (QWEN3_CODER_XML, {}, HELLO, ChatMessage(HELLO)),
    (QWEN3_CODER_XML, {}, "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n"
                          "</tool_call>", CALL),
    (QWEN3_CODER_XML, {}, "Let me call it.\n<tool_call>\n<function=special_function_with_opt>\n<parameter=arg1>\n1\n"
                          "</parameter>\n<parameter=arg2>\n2\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
                          "<function=edit>\n<parameter=path>\nsrc/a b.py\n</parameter>\n</function>\n</tool_call>",
     ChatMessage("Let me call it.\n", [ToolCall("special_function_with_opt", '{"arg1": 1, "arg2": 2}'),
                                       ToolCall("edit", '{"path": "src/a b.py"}')])),
    # GPT-OSS
    (GPT_OSS, {}, "<|channel|>final<|message|>" + HELLO, ChatMessage(HELLO)),
    (GPT_OSS, {}, "<|channel|>commentary<|message|>" + HELLO, ChatMessage(HELLO)),
    (GPT_OSS, {}, "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>"
                  + HELLO, THOUGHTS),
    (GPT_OSS, {}, " to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}", CALL),
    (GPT_OSS, {}, "<|channel|>analysis to=functions.special_function<|message|>{\"arg1\": 1}", CALL),
    (GPT_OSS, {}, " to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>{\"arg1\": 1}", CALL),
    (GPT_OSS, {}, "<|channel|>commentary to=functions.special_function<|message|>{\"arg1\": 1}", CALL),
    (GPT_OSS, {}, "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant to=functions.special_function"
                  "<|channel|>analysis<|message|>{\"arg1\": 1}",
     ChatMessage("", [ToolCall("special_function", '{"arg1": 1}')], "I'm\nthinking")),
    (GPT_OSS, {}, "<|channel|>analysis<|message|>Thinking about edit...<|end|><|start|>assistant<|channel|>commentary"
                  " to=functions.edit <|constrain|>json<|message|>{\"path\": \"if (part < 4) {\", \"count\": 2}",
     ChatMessage("", [ToolCall("edit", '{"path": "if (part < 4) {", "count": 2}')], "Thinking about edit...")),
    # Command R7B
    (COMMAND_R7B, {}, "<|START_RESPONSE|>" + HELLO + "<|END_RESPONSE|>", ChatMessage(HELLO)),
    (COMMAND_R7B, {}, "<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_RESPONSE|>" + HELLO + "<|END_RESPONSE|>",
     THOUGHTS),
    (COMMAND_R7B, {"extract_reasoning": False}, "<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_RESPONSE|>"
     + HELLO + "<|END_RESPONSE|>", ChatMessage("<|START_THINKING|>I'm\nthinking<|END_THINKING|>" + HELLO)),
    (COMMAND_R7B, {}, "<|START_THINKING|>I'm\nthinking<|END_THINKING|>" + R7B_ACTION,
     ChatMessage("", [ToolCall("special_function", '{"arg1": 1}', "0")], "I'm\nthinking")),
    # Functionary v3.2
    (FUNCTIONARY_V3_2, {}, "all\n" + HELLO, ChatMessage(HELLO)),
    (FUNCTIONARY_V3_2, {}, "all\nHello, world!\nnono\nWhat's up?>>>special_function\n{\"arg1\": 1}\n",
     ChatMessage("Hello, world!\nnono\nWhat's up?", [ToolCall("special_function", '{"arg1": 1}')])),
    (FUNCTIONARY_V3_2, {}, "special_function\n{\"arg1\": 1} \n                    ", CALL),
    (FUNCTIONARY_V3_2, {}, "python\n# This is a program:\nprint('hey')",
     ChatMessage("", [ToolCall("python", '{"code":"# This is a program:\\nprint(\'hey\')"}')])),
    # FireFunction v2
    (FIREFUNCTION_V2, {}, HELLO, ChatMessage(HELLO)),
    (FIREFUNCTION_V2, {}, ' functools[{"name": "special_function", "arguments": {"arg1": 1}}]', CALL),
]


@pytest.mark.parametrize(("fmt", "options", "text", "expected"), PARSE_CASES)
def test_parse(fmt, options, text, expected):
    assert parse_answer(text, syntax(fmt, **options)) == expected


def test_partial_answers_hold_back_what_may_still_be_a_call():
    # test-chat.cpp: a partial raw python call keeps its string open; DeepSeek R1's reasoning that mentions the tag
    assert parse_answer("python\n# This is a program:\nprint('hey')", syntax(FUNCTIONARY_V3_2), partial=True) == \
        ChatMessage("", [ToolCall("python", '{"code":"# This is a program:\\nprint(\'hey\')')])
    text = "I need to remember the correct syntax. It starts with <｜tool▁calls▁begin｜> and ends with"
    assert parse_answer(text, syntax(DEEPSEEK_R1, thinking_open=True), partial=True) == ChatMessage("", [], text)
    partial = "<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_ACTION|>[\n    {\"tool_call_id\": \"0\", " \
              "\"tool_name\": \"special_function\", "
    assert parse_answer(partial, syntax(COMMAND_R7B), partial=True) == \
        ChatMessage("", [ToolCall("special_function", "", "0")], "I'm\nthinking")
    assert parse_answer("<|channel|>analysis<|message|>I'm\nthinking", syntax(GPT_OSS), partial=True) == \
        ChatMessage("", [], "I'm\nthinking")
    assert parse_answer("Hello <｜tool▁ca", syntax(DEEPSEEK_R1), partial=True) == ChatMessage("Hello ")


@pytest.mark.parametrize(("fmt", "text"), [
    (DEEPSEEK_R1, DS_CALL.replace("<｜tool▁calls▁end｜>", "")),  # the block is not closed
    (DEEPSEEK_V3_1, V31_TIME.replace("{C}", "Paris")),
    (QWEN3_CODER_XML, "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n"),
    (COMMAND_R7B, '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "special_function", "parameters": {"arg1": }}]'
                  "<|END_ACTION|>"),
    (FIREFUNCTION_V2, ' functools[{"name": "special_function", "arguments": {"arg1": 1}}'),
])
def test_a_final_answer_without_the_format_is_content(fmt, text):
    assert parse_answer(text, syntax(fmt)) == ChatMessage(text)


# --- streaming ---------------------------------------------------------------------------------------------------

STREAMS = [
    (DEEPSEEK_R1, {"thinking_open": True}, "Let me think.</think>Sure. " + DS_CALL.replace(
        "<｜tool▁calls▁end｜>", "\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>python\n```json\n"
                              "{\"code\": \"print('é')\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")),
    (DEEPSEEK_V3_1, {"thinking_open": True}, "REASONING</think>CONTENT" + V31_TIME.replace("{C}", "Paris")
     + "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    (QWEN3_CODER_XML, {}, "Let me call it.\n<tool_call>\n<function=edit>\n<parameter=path>\nsrc/a \"b\".py\n"
                          "</parameter>\n<parameter=count>\n12\n</parameter>\n</function>\n</tool_call>"),
    (GPT_OSS, {}, "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>commentary"
                  " to=functions.edit <|constrain|>json<|message|>{\"path\": \"x\", \"count\": 2}"),
    (COMMAND_R7B, {}, "<|START_THINKING|>I'm\nthinking<|END_THINKING|>" + R7B_ACTION.replace(
        "}}\n]", '}}, {"tool_call_id": "1", "tool_name": "special_function", "parameters": {"arg1": 2}}\n]')),
    (COMMAND_R7B, {}, "<|START_RESPONSE|>" + HELLO + "<|END_RESPONSE|>"),
    (FUNCTIONARY_V3_2, {}, "all\nLet me see.>>>special_function\n{\"arg1\": 1}\n>>>python\nprint('hey')\nprint(2)"),
    (FIREFUNCTION_V2, {}, 'Calling. functools[{"name": "special_function", "arguments": {"arg1": 1}}, {"name": '
                          '"special_function", "arguments": {"arg1": 2}}]'),
]


@pytest.mark.parametrize(("fmt", "options", "text"), STREAMS)
def test_stream_deltas_add_up_to_the_message(fmt, options, text):
    stream = MessageStream(syntax(fmt, **options))
    diffs = [d for i in range(0, len(text), 3) for d in stream.update(text[i:i + 3])]
    diffs += stream.update("", final=True)
    whole = parse_answer(text, syntax(fmt, **options))
    assert whole.tool_calls or whole.content  # the case parses as the format
    reasoning = "".join(d.reasoning for d in diffs)
    content = "".join(d.content for d in diffs)
    calls: dict[int, list[str]] = {}
    for d in diffs:
        if d.tool_index >= 0:
            assert d.header == (d.tool_index not in calls)
            calls.setdefault(d.tool_index, [d.tool_name, ""])[1] += d.tool_arguments
    assert (reasoning, content) == (whole.reasoning_content, whole.content)
    assert [tuple(c) for c in calls.values()] == [(c.name, c.arguments) for c in whole.tool_calls]


# --- grammars ------------------------------------------------------------------------------------------------------


def params_of(fmt, req, thinking_open=False):
    return detect(template(fmt).source, req, None).params(
        ToolSetup(req, req.choice == "required", bool(req.parallel), None, thinking_open))


def accepts(grammar: str, text: str) -> bool:
    m = Grammar.from_gbnf(grammar).matcher()
    return m.accept_str(text) and m.is_accepting()


DS_GRAMMAR_CALL = DS_CALL.replace("}\n```", "}```")  # as llama.cpp's grammar has it: the fence right after the JSON
GRAMMARS = [
    (DEEPSEEK_R1, DS_GRAMMAR_CALL, DS_GRAMMAR_CALL.replace('{"arg1": 1}', '{"arg1": "1"}')),
    (DEEPSEEK_V3_1, V31_TIME.replace("get_time", "special_function").replace('{"city": "{C}"}', '{"arg1": 1}')
     + "<｜tool▁calls▁end｜>",
     V31_TIME.replace("get_time", "special_function").replace('{"city": "{C}"}', '{"arg2": 1}')
     + "<｜tool▁calls▁end｜>"),
    (QWEN3_CODER_XML, "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n"
                      "</tool_call>",
     "<tool_call>\n<function=special_function>\n<parameter=arg1>\none\n</parameter>\n</function>\n</tool_call>"),
    (GPT_OSS, " to=functions.special_function<|channel|>commentary <|constrain|>json<|message|>{\"arg1\": 1}",
     " to=functions.special_function<|channel|>commentary <|constrain|>json<|message|>{\"arg1\": 1.5}"),
    (COMMAND_R7B, R7B_ACTION, R7B_ACTION.replace('"0"', '"zero"')),
    (FUNCTIONARY_V3_2, 'special_function\n{"arg1": 1}', 'special_function\n{"arg1": true}'),
    (FIREFUNCTION_V2, ' functools[{"name": "special_function", "arguments": {"arg1": 1}}]',
     ' functools[{"name": "special_function", "arguments": {}}]'),
]


@pytest.mark.parametrize(("fmt", "good", "bad"), GRAMMARS)
def test_grammar_takes_calls_valid_for_the_schema(fmt, good, bad):
    params = params_of(fmt, request(SPECIAL, parallel=False))
    assert params.grammar_lazy and params.name == fmt
    assert accepts(params.grammar, good)
    assert not accepts(params.grammar, bad)


def test_grammars_with_strings_code_and_several_calls():
    qwen = params_of(QWEN3_CODER_XML, request(EDIT))
    call = "<tool_call>\n<function=edit>\n<parameter=path>\nsrc/a <b>.py\n</parameter>\n{}</function>\n</tool_call>"
    assert accepts(qwen.grammar, call.format(""))  # the optional count left out, the path raw text
    assert accepts(qwen.grammar, call.format("<parameter=count>\n3\n</parameter>\n"))
    assert not accepts(qwen.grammar, call.format("<parameter=count>\nthree\n</parameter>\n"))
    functionary = params_of(FUNCTIONARY_V3_2, request(SPECIAL, PYTHON, parallel=True))
    assert accepts(functionary.grammar, "python\nprint('hey')")  # raw code
    assert accepts(functionary.grammar, 'special_function\n{"arg1": 1}>>>python\n{"code": "1"}')
    r1 = params_of(DEEPSEEK_R1, request(SPECIAL, parallel=True), thinking_open=True)
    one = DS_GRAMMAR_CALL[len("<｜tool▁calls▁begin｜>"):-len("<｜tool▁calls▁end｜>")]
    two = DS_GRAMMAR_CALL.replace("<｜tool▁calls▁end｜>", one + "<｜tool▁calls▁end｜>")
    assert accepts(r1.grammar, "</think>\n" + two)
    required = params_of(GPT_OSS, request(SPECIAL, choice="required"))
    assert not required.grammar_lazy
    assert accepts(required.grammar, "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant"
                                     " to=functions.special_function<|channel|>commentary<|message|>{\"arg1\": 1}")


def test_triggers_and_preserved_tokens_as_llama_cpp_sets_them():
    req = request(SPECIAL)
    begins = ("(<｜tool▁calls▁begin｜>|<｜tool_calls_begin｜>|<｜tool calls begin｜>|"
              "<｜tool\\\\_calls\\\\_begin｜>|<｜tool▁calls｜>)")
    r1 = params_of(DEEPSEEK_R1, req)
    assert r1.triggers == ((TRIGGER_PATTERN_FULL, r"(?:<think>[\s\S]*?</think>\s*)?" + begins + r"[\s\S]*"),)
    assert params_of(DEEPSEEK_R1, req, True).triggers[0][1].startswith(r"[\s\S]*?(</think>\s*)(")
    assert r1.preserved_tokens == ("<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>",
                                   "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>")
    assert params_of(QWEN3_CODER_XML, req).triggers == ((TRIGGER_WORD, "<tool_call>\n<function="),)
    assert params_of(GPT_OSS, req).triggers == ((TRIGGER_PATTERN, r"<\|channel\|>(commentary|analysis) to"),
                                                (TRIGGER_PATTERN_FULL, "^ to"),
                                                (TRIGGER_PATTERN, r"<\|start\|>assistant to"))
    assert params_of(COMMAND_R7B, req).triggers == (
        (TRIGGER_PATTERN_FULL, r"(?:<\|START_THINKING\|>[\s\S]*?<\|END_THINKING\|>\s*)?(<\|START_ACTION\|>)[\s\S]*"),)
    assert params_of(FUNCTIONARY_V3_2, request(SPECIAL, PYTHON)).triggers == (
        (TRIGGER_PATTERN_FULL, "((?:[\\s\\S]+?>>>)?special_function\n)\\{[\\s\\S]*"),
        (TRIGGER_PATTERN_FULL, "((?:[\\s\\S]+?>>>)?python\n)[\\s\\S]*"))
    fire = params_of(FIREFUNCTION_V2, req)
    assert (fire.triggers, fire.preserved_tokens) == (((TRIGGER_WORD, " functools["),), (" functools[",))


# --- prompts through the real templates ---------------------------------------------------------------------------

HISTORY = [USER, ASSISTANT_CALL, TOOL_RESULT, {"role": "assistant", "content": "The answer is 42."},
           {"role": "user", "content": "Again"}]
PROMPTS = [
    # the tools (the polyfill where the template renders none), the call and the result as the template writes them
    (DEEPSEEK_R1, ['{\n    "name": "special_function",\n    "description": "I\'m special"',
                   "<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n"
                   '```json\n{"arg1": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>',
                   "<｜tool▁outputs▁begin｜>\n<｜tool▁output▁begin｜>42<｜tool▁output▁end｜><｜tool▁outputs▁end｜>"],
     "<｜User｜>Again<｜end▁of▁sentence｜><｜Assistant｜><think>\n"),
    (DEEPSEEK_V3_1, ["You can call any of the following tools to satisfy the user's requests: [\n  {\n    \"type\": "
                     '"function",\n    "function": {\n      "name": "special_function"',
                     "<｜Assistant｜><think></think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>special_function"
                     '<｜tool▁sep｜>{"arg1": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>',
                     "<｜tool▁output▁begin｜>42<｜tool▁output▁end｜>The answer is 42."],
     "<｜User｜>Again<｜Assistant｜><think>"),
    (QWEN3_CODER_XML, ["<tools>\n<function>\n<name>special_function</name>\n<description>I'm special</description>",
                       "<|im_start|>assistant\n<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n"
                       "</parameter>\n</function>\n</tool_call><|im_end|>",
                       "<|im_start|>user\n<tool_response>\n42\n</tool_response>\n<|im_end|>"],
     "<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n"),
    (GPT_OSS, ["// I'm special\ntype special_function = (_: {\n// The arg.\narg1: number,\n}) => any;",
               "<|start|>assistant to=functions.special_function<|channel|>commentary json<|message|>{\"arg1\": 1}"
               "<|call|>",
               "<|start|>functions.special_function to=assistant<|channel|>commentary<|message|>\"42\"<|end|>"],
     "<|start|>user<|message|>Again<|end|><|start|>assistant"),
    (COMMAND_R7B, ['{"name": "special_function", "description": "I\'m special", "parameters": {"type": "object", '
                   '"properties": {"arg1": {"type": "integer", "description": "The arg."}}, "required": ["arg1"]}, '
                   '"responses": null}',
                   "<|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|><|START_ACTION|>[\n    {\"tool_call_id\": "
                   "\"0\", \"tool_name\": \"special_function\", \"parameters\": {\"arg1\": 1}}\n]<|END_ACTION|>",
                   '<|START_TOOL_RESULT|>[\n    {\n        "tool_call_id": "0",\n        "results": {\n            '
                   '"0": "42"\n        },\n        "is_error": null\n    }\n]<|END_TOOL_RESULT|>'],
     "<|USER_TOKEN|>Again<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
    (FUNCTIONARY_V3_2, ["// I'm special\ntype special_function = (_: {\n// The arg.\narg1: number,\n}) => any;",
                        "<|start_header_id|>assistant<|end_header_id|>\n\n>>>special_function\n{\"arg1\": 1}<|eot_id|>",
                        "<|start_header_id|>tool<|end_header_id|>\n\n42<|eot_id|>",
                        ">>>all\nThe answer is 42.<|eot_id|>"],
     "<|start_header_id|>assistant<|end_header_id|>\n\n>>>"),
    (FIREFUNCTION_V2, ["Available functions as JSON spec:\n" + json.dumps([SPECIAL], indent=2),
                       "<|start_header_id|>assistant<|end_header_id|>\n\n functools[{\"name\": \"special_function\", "
                       "\"arguments\": {\"arg1\": 1}}]<|eot_id|>",
                       "<|start_header_id|>tool<|end_header_id|>\n\n42<|eot_id|>"],
     "<|start_header_id|>user<|end_header_id|>\n\nAgain<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
]


@pytest.mark.parametrize(("fmt", "parts", "end"), PROMPTS)
def test_prompt_renders_tools_calls_and_results_as_the_template_does(fmt, parts, end):
    params = apply(template(fmt), HISTORY, request(SPECIAL), ChatOptions())
    for part in parts:
        assert part in params.prompt
    assert params.prompt.endswith(end)
    assert params.format.grammar and params.format.name == fmt
    assert "Respond in JSON format" not in params.prompt  # not the generic format's system line


def test_firefunction_gets_its_tools_only_as_functions():
    prompt = apply(template(FIREFUNCTION_V2), [USER], request(SPECIAL)).prompt
    assert prompt.count('"name": "special_function"') == 1  # no tools polyfill on top
    assert "You can call any of the following tools" not in prompt


def test_thinking_open_and_closed():
    v31 = template(DEEPSEEK_V3_1)
    assert apply(v31, [USER], request(SPECIAL)).syntax.thinking_open
    off = apply(v31, [USER], request(SPECIAL), ChatOptions(enable_thinking=False))
    assert off.prompt.endswith("<｜Assistant｜><think></think>") and not off.syntax.thinking_open
    r7b = apply(template(COMMAND_R7B), [USER], request(SPECIAL), ChatOptions(enable_thinking=False))
    assert r7b.prompt.endswith("<|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>")
    r1_off = apply(template(DEEPSEEK_R1), [USER], None, ChatOptions(enable_thinking=False))
    assert r1_off.prompt.endswith("<｜Assistant｜><think>\n</think>")


def test_qwen3_coder_reads_string_parameters_as_text():
    # parse_xml_tool_calls reads a value by its parameter's schema type: "12" is a string for EDIT's path, a number
    # for its count
    params = apply(template(QWEN3_CODER_XML), [USER], request(EDIT))
    assert params.syntax.string_args == frozenset({("edit", "path")})
    text = ("<tool_call>\n<function=edit>\n<parameter=path>\n12\n</parameter>\n<parameter=count>\n12\n</parameter>\n"
            "</function>\n</tool_call>")
    assert parse_answer(text, params.syntax) == ChatMessage("", [ToolCall("edit", '{"path": "12", "count": 12}')])
    stream = MessageStream(params.syntax)
    for i in range(0, len(text), 3):
        stream.update(text[i:i + 3])
    stream.update("", final=True)
    assert [(c.name, c.arguments) for c in stream.msg.tool_calls] == [("edit", '{"path": "12", "count": 12}')]
