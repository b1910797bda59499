# ruff: noqa: RUF001  (DeepSeek's markers are full-width characters)
"""The chat layer's reading of answers at its edges: a thinking block the prompt left open, a stream cut inside a
tool call, ids in a format's shape, and text nested past Python's stack."""

from samplechain.chat import (
    ChatMessage,
    ChatOptions,
    ChatSyntax,
    ChatTemplate,
    MessageStream,
    ToolCall,
    apply,
    parse,
    parse_tool_request,
)
from samplechain.chat.formats import GENERIC, HERMES_2_PRO, MISTRAL_NEMO

# a Hermes-family template (it writes <tool_call>) whose generation prompt opens the thinking block without a newline
HERMES_THINK = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n<think>{% endif %}"
                "{# <tool_call> #}")
TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}}
USER = [{"role": "user", "content": "Hi"}]


def test_a_prompt_ending_in_the_start_tag_leaves_the_block_open_whatever_follows_it():
    params = apply(ChatTemplate(HERMES_THINK), USER)
    assert params.prompt.endswith("assistant\n<think>")
    assert params.syntax.thinking_open
    assert parse("reasoning here</think>answer", params.syntax) == ChatMessage("answer",
                                                                              reasoning_content="reasoning here")
    # with thinking off, only a prompt ending exactly in "<think>\n" is closed by the format; this one stays open
    off = apply(ChatTemplate(HERMES_THINK), USER, options=ChatOptions(enable_thinking=False))
    assert off.prompt == params.prompt and off.syntax.thinking_open


def test_a_stream_cut_inside_a_call_keeps_what_it_streamed():
    syntax = ChatSyntax(HERMES_2_PRO, True)
    text = 'Sure. <tool_call>\n{"name": "f", "arguments": {"a": "hello wor'
    stream = MessageStream(syntax)
    diffs = [d for i in range(0, len(text), 4) for d in stream.update(text[i:i + 4])]
    last = stream.update("", final=True)
    assert "".join(d.content for d in diffs) == "Sure. "
    assert next((d.tool_name, d.header) for d in diffs if d.tool_index == 0) == ("f", True)
    assert "".join(d.tool_arguments for d in diffs) == '{"a": "hello wor'
    assert last == []  # the raw markup is not sent again as content
    assert stream.msg.content == "Sure. " and [c.name for c in stream.msg.tool_calls] == ["f"]
    assert parse(text, syntax) == ChatMessage(text)  # read whole, a cut call is content (llama.cpp's rule)


def test_ids_the_stream_makes_have_the_formats_shape():
    text = '[TOOL_CALLS][{"name": "f", "arguments": {"a": "x"}, "id": "abcdefghi"}]'
    stream = MessageStream(ChatSyntax(MISTRAL_NEMO, True))
    for i in range(0, len(text), 3):
        stream.update(text[i:i + 3])
    stream.update("", final=True)
    (call,) = stream.msg.tool_calls
    assert (call.name, call.arguments) == ("f", '{"a": "x"}')
    assert len(call.id) == 9 and call.id.isalnum()  # fixed before the model wrote its own (Mistral wants 9)
    assert parse(text, ChatSyntax(MISTRAL_NEMO, True)).tool_calls == [ToolCall("f", '{"a": "x"}', "abcdefghi")]
    assert len(ChatSyntax(GENERIC, True).new_id()) == 32


def test_text_nested_past_pythons_stack_is_content():
    deep = '{"tool_call": {"name": "f", "arguments": {"a": ' + "[" * 5000 + "]" * 5000 + "}}}"
    assert parse(deep, ChatSyntax(GENERIC, True)) == ChatMessage(deep)


def test_a_history_call_nested_past_pythons_stack_renders_as_its_text():
    deep = "[" * 5000 + "]" * 5000
    messages = [*USER, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": deep}}]},
                {"role": "tool", "tool_call_id": "a", "content": "ok"}]
    params = apply(ChatTemplate("chatml", builtin=True), messages, parse_tool_request({"tools": [TOOL]}))
    assert deep in params.prompt


def test_calls_in_a_thinking_block_never_closed_are_calls():
    # DeepSeek R1's grammar lets "</think>" out when the prompt opened the block; SmolLM2 then writes the call
    # straight away: read whole it is the call, streamed the reasoning already sent stands and the call follows it
    from samplechain.chat.formats import DEEPSEEK_R1

    syntax = ChatSyntax(DEEPSEEK_R1, True, thinking_open=True)
    text = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": \"x\"}\n```"
            "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    assert parse(text, syntax) == ChatMessage("", [ToolCall("f", '{"a": "x"}')])
    stream = MessageStream(syntax)
    diffs = [d for i in range(0, len(text), 5) for d in stream.update(text[i:i + 5])]
    diffs += stream.update("", final=True)
    assert "".join(d.reasoning for d in diffs) == text
    assert [(d.tool_name, d.tool_arguments) for d in diffs if d.tool_index == 0] == [("f", '{"a": "x"}')]
    assert parse("just thinking", syntax) == ChatMessage("", reasoning_content="just thinking")
